//! [`Cluster`] on PostgreSQL: the `replicas` and `settings` tables
//! (migration 3).

use std::time::Duration;

use async_trait::async_trait;
use tokio_postgres::Row;
use tokio_postgres::types::Json;

use super::PostgresStore;
use super::codec;
use crate::store::StoreError;
use crate::store::cluster::{Cluster, DefaultModel, Replica};
use crate::types::ThinkingLevel;

/// The `settings` row of the default model.
const DEFAULT_MODEL: &str = "default_model";

/// The default model as the `settings` row stores it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StoredDefault {
    model: String,
    thinking: Option<ThinkingLevel>,
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn replica(row: &Row) -> Result<Replica, StoreError> {
    let corrupt = |e: tokio_postgres::Error| StoreError::Corrupt {
        key: "replicas/?".to_owned(),
        reason: e.to_string(),
    };
    Ok(Replica {
        id: row.try_get("id").map_err(corrupt)?,
        address: row.try_get("address").map_err(corrupt)?,
        started_at: row.try_get("started_at").map_err(corrupt)?,
        heartbeat_at: row.try_get("heartbeat_at").map_err(corrupt)?,
    })
}

fn default_model(row: &Row) -> Result<DefaultModel, StoreError> {
    let corrupt = |e: tokio_postgres::Error| StoreError::Corrupt {
        key: format!("settings/{DEFAULT_MODEL}"),
        reason: e.to_string(),
    };
    let value: Json<StoredDefault> = row.try_get("value").map_err(corrupt)?;
    Ok(DefaultModel {
        model: value.0.model,
        thinking: value.0.thinking,
        version: row.try_get("version").map_err(corrupt)?,
    })
}

#[async_trait]
impl Cluster for PostgresStore {
    async fn heartbeat(&self, forget_after: Duration) -> Result<(), StoreError> {
        let client = self.client().await?;
        let sql = "INSERT INTO replicas (id, address, started_at, heartbeat_at) \
                   VALUES ($1, $2, clock_timestamp(), clock_timestamp()) \
                   ON CONFLICT (id) DO UPDATE SET address = EXCLUDED.address, \
                   heartbeat_at = EXCLUDED.heartbeat_at";
        codec::execute(&client, sql, &[&self.replica_id, &self.address]).await?;
        let sql = "DELETE FROM replicas \
                   WHERE heartbeat_at < clock_timestamp() - $1::bigint * interval '1 microsecond'";
        codec::execute(&client, sql, &[&micros(forget_after)]).await?;
        Ok(())
    }

    async fn live_replicas(&self, within: Duration) -> Result<Vec<Replica>, StoreError> {
        let client = self.client().await?;
        let sql = "SELECT id, address, started_at, heartbeat_at FROM replicas \
                   WHERE heartbeat_at >= clock_timestamp() - $1::bigint * interval '1 microsecond' \
                   ORDER BY id";
        codec::rows(&client, sql, &[&micros(within)])
            .await?
            .iter()
            .map(replica)
            .collect()
    }

    async fn leave(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        codec::execute(
            &client,
            "DELETE FROM replicas WHERE id = $1",
            &[&self.replica_id],
        )
        .await?;
        Ok(())
    }

    async fn default_model(&self) -> Result<Option<DefaultModel>, StoreError> {
        let client = self.client().await?;
        let sql = "SELECT value, version FROM settings WHERE name = $1";
        codec::row(&client, sql, &[&DEFAULT_MODEL])
            .await?
            .as_ref()
            .map(default_model)
            .transpose()
    }

    async fn set_default_model(
        &self,
        model: &str,
        thinking: Option<ThinkingLevel>,
    ) -> Result<DefaultModel, StoreError> {
        let client = self.client().await?;
        let value = Json(StoredDefault {
            model: model.to_owned(),
            thinking,
        });
        let sql = "INSERT INTO settings (name, value, version, updated_at) \
                   VALUES ($1, $2, 1, clock_timestamp()) \
                   ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, \
                   version = settings.version + 1, updated_at = EXCLUDED.updated_at \
                   RETURNING value, version";
        let row = codec::row(&client, sql, &[&DEFAULT_MODEL, &value])
            .await?
            .ok_or_else(|| {
                StoreError::Backend("storing the default model returned no row".to_owned())
            })?;
        default_model(&row)
    }
}
