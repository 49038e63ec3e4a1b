//! [`ClientBuilder`]: the URL, credentials (bearer token, TLS, mTLS),
//! timeouts and resume policy of a [`Client`], checked before it connects.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::proto::agent_runtime_client::AgentRuntimeClient;
use crate::proto::agent_service_client::AgentServiceClient;
use crate::proto::runtime_admin_client::RuntimeAdminClient;
use crate::proto::session_service_client::SessionServiceClient;
use crate::{Client, Error, ResumePolicy, error};
use tonic_health::pb::health_client::HealthClient;

/// PEM read now or from a file at connect time.
#[derive(Debug, Clone)]
enum Pem {
    Bytes(Vec<u8>),
    File(PathBuf),
}

impl Pem {
    fn read(&self, what: &str) -> Result<Vec<u8>, Error> {
        match self {
            Pem::Bytes(b) => Ok(b.clone()),
            Pem::File(path) => std::fs::read(path)
                .map_err(|e| Error::Config(format!("cannot read {what} {}: {e}", path.display()))),
        }
    }
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Debug, Clone)]
pub struct Auth {
    header: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

/// Configures a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    token: Option<String>,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
    chat_deadline: Option<Duration>,
    ca: Option<Pem>,
    identity: Option<(Pem, Pem)>,
    domain: Option<String>,
    system_roots: bool,
    insecure_token: bool,
    resume: ResumePolicy,
}

impl ClientBuilder {
    /// The defaults for `url` ([`Client::builder`]).
    pub(crate) fn new(url: String) -> Self {
        Self {
            url,
            token: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: None,
            chat_deadline: None,
            ca: None,
            identity: None,
            domain: None,
            system_roots: true,
            insecure_token: false,
            resume: ResumePolicy::default(),
        }
    }

    /// Whether an `https://` URL trusts the system's root certificates
    /// (those of the operating system's trust store). Default: true; a CA
    /// given with [`ClientBuilder::ca_file`] or [`ClientBuilder::ca_pem`]
    /// is trusted beside them. With false only that CA is trusted.
    pub fn system_roots(mut self, trust: bool) -> Self {
        self.system_roots = trust;
        self
    }

    /// Trusts the PEM CA certificate(s) in `path` for an `https://` URL,
    /// beside the system's roots.
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.ca = Some(Pem::File(path.as_ref().to_path_buf()));
        self
    }

    /// Trusts the PEM CA certificate(s) `pem` for an `https://` URL,
    /// beside the system's roots.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// Presents the PEM client certificate `cert` with its key `key`
    /// (mTLS).
    pub fn identity_files(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.identity = Some((
            Pem::File(cert.as_ref().to_path_buf()),
            Pem::File(key.as_ref().to_path_buf()),
        ));
        self
    }

    /// Presents the PEM client certificate `cert` with its key `key`
    /// (mTLS).
    pub fn identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((Pem::Bytes(cert.into()), Pem::Bytes(key.into())));
        self
    }

    /// The name the server's certificate must carry. Default: the URL's
    /// host.
    pub fn tls_domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    fn tls(&self) -> Result<Option<ClientTlsConfig>, Error> {
        let https = self.url.starts_with("https://");
        let wanted = self.ca.is_some() || self.identity.is_some() || self.domain.is_some();
        if !https {
            return if wanted {
                Err(Error::Config(format!(
                    "TLS options (CA, client certificate) need an https:// URL, not {:?}",
                    self.url
                )))
            } else {
                Ok(None)
            };
        }
        let mut tls = ClientTlsConfig::new();
        if self.system_roots {
            tls = tls.with_native_roots();
        }
        match &self.ca {
            Some(ca) => tls = tls.ca_certificate(Certificate::from_pem(ca.read("CA file")?)),
            None if !self.system_roots => {
                return Err(Error::Config(format!(
                    "{}: with the system's root certificates turned off, an https:// URL \
                     needs the CA certificate that signed the server's certificate (--ca FILE)",
                    self.url
                )));
            }
            None => {}
        }
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(
                cert.read("client certificate file")?,
                key.read("client key file")?,
            ));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        Ok(Some(tls))
    }

    /// Sends `authorization: Bearer <token>` with every call.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Allows a bearer token over plaintext `http://` to a host that is not
    /// loopback (refused by default: anyone on the path could read it).
    pub fn allow_insecure_token(mut self, allow: bool) -> Self {
        self.insecure_token = allow;
        self
    }

    /// Bounds connection set-up. Default 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Default deadline of unary calls (not of event streams). Default
    /// none; [`Client::with_timeout`] overrides it per call.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Default gRPC deadline of chats (it bounds the turn too). Default
    /// none; [`ChatOptions::deadline`](crate::ChatOptions::deadline) overrides it per call.
    pub fn chat_deadline(mut self, deadline: Duration) -> Self {
        self.chat_deadline = Some(deadline);
        self
    }

    /// How resuming chats and watches reconnect by default.
    pub fn resume_policy(mut self, policy: ResumePolicy) -> Self {
        self.resume = policy;
        self
    }

    /// Checks the URL and the credentials before anything is sent: a
    /// scheme is required, and a token goes in plaintext only to loopback
    /// (or when allowed).
    fn check(&self) -> Result<http::Uri, Error> {
        let url = &self.url;
        if !url.contains("://") {
            return Err(Error::Config(format!(
                "server URL {url:?} has no scheme: write http://{url} (plaintext) or \
                 https://{url} (TLS)"
            )));
        }
        let uri: http::Uri = url
            .parse()
            .map_err(|e| Error::Config(format!("server URL {url:?} is not a URL: {e}")))?;
        let host = uri.host().unwrap_or_default();
        if host.is_empty() {
            return Err(Error::Config(format!("server URL {url:?} has no host")));
        }
        match uri.scheme_str() {
            Some("http") => {
                if self.token.is_some() && !self.insecure_token && !is_loopback(host) {
                    return Err(Error::Config(format!(
                        "refusing to send the API key in plaintext to {url}, which is not this \
                         machine: use an https:// URL, or allow plaintext explicitly (--insecure)"
                    )));
                }
            }
            Some("https") => {}
            Some(other) => {
                return Err(Error::Config(format!(
                    "server URL {url:?} has scheme {other:?}; use http:// or https://"
                )));
            }
            None => {
                return Err(Error::Config(format!(
                    "server URL {url:?} has no scheme: write http://{url} or https://{url}"
                )));
            }
        }
        Ok(uri)
    }

    /// Checks the configuration and connects.
    pub async fn connect(self) -> Result<Client, Error> {
        self.check()?;
        let header = match &self.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| Error::Config("the token must be printable ASCII".into()))?,
            ),
            None => None,
        };
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| Error::Config(format!("server URL {:?}: {e}", self.url)))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = self.tls()? {
            endpoint = endpoint.tls_config(tls).map_err(|e| {
                Error::Config(format!("TLS for {}: {}", self.url, error::cause_chain(&e)))
            })?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| Error::connect(&self.url, &e))?;
        let auth = Auth { header };
        Ok(Client {
            url: self.url,
            sessions: SessionServiceClient::with_interceptor(channel.clone(), auth.clone()),
            runtime: AgentRuntimeClient::with_interceptor(channel.clone(), auth.clone()),
            admin: RuntimeAdminClient::with_interceptor(channel.clone(), auth.clone()),
            agents: AgentServiceClient::with_interceptor(channel.clone(), auth.clone()),
            health: HealthClient::with_interceptor(channel, auth),
            request_timeout: self.request_timeout,
            chat_deadline: self.chat_deadline,
            resume: self.resume,
        })
    }
}

/// `localhost`, 127.0.0.0/8 or ::1.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(builder: ClientBuilder) -> String {
        match builder.tls() {
            Err(Error::Config(message)) => message,
            other => panic!("expected Config, got {other:?}"),
        }
    }

    #[test]
    fn tls_options_need_an_https_url_and_https_without_system_roots_needs_a_ca() {
        let message = refused(Client::builder("http://127.0.0.1:1").ca_pem(b"pem".to_vec()));
        assert!(message.contains("https://"), "{message}");
        let message = refused(Client::builder("https://127.0.0.1:1").system_roots(false));
        assert!(message.contains("--ca"), "{message}");
        assert!(
            Client::builder("https://127.0.0.1:1")
                .tls()
                .unwrap()
                .is_some(),
            "the system's roots are trusted by default"
        );
        let message = refused(Client::builder("https://127.0.0.1:1").ca_file("/no/such/ca.pem"));
        assert!(message.contains("/no/such/ca.pem"), "{message}");
        assert!(
            Client::builder("http://127.0.0.1:1")
                .tls()
                .unwrap()
                .is_none()
        );
        assert!(
            Client::builder("https://127.0.0.1:1")
                .ca_pem(b"pem".to_vec())
                .tls()
                .unwrap()
                .is_some()
        );
    }
}
