//! Unit tests of [`super::Authenticator`].

use super::*;
use crate::config::{ApiKeyConfig, MtlsConfig};

fn no_env(_: &str) -> Option<String> {
    None
}

fn auth() -> Authenticator {
    Authenticator::new(
        &AuthConfig {
            api_keys: vec![ApiKeyConfig::inline("secret-a", "alice", false)],
            api_keys_file: None,
            mtls: vec![
                MtlsConfig::uri("spiffe://test/bob", "bob", true),
                MtlsConfig::common_name("carol-cn", "carol", false),
            ],
        },
        &no_env,
    )
    .unwrap()
}

/// A certificate with the URI SAN `identity` (when it looks like a URI)
/// or else the subject CN `identity`.
fn cert(identity: Option<&str>) -> ClientCertificate {
    match identity {
        Some(uri) if uri.contains("://") => named(&[uri], None),
        cn => named(&[], cn),
    }
}

fn named(uris: &[&str], cn: Option<&str>) -> ClientCertificate {
    ClientCertificate {
        uris: uris.iter().map(|u| (*u).to_owned()).collect(),
        common_name: cn.map(str::to_owned),
    }
}

fn md(value: Option<&str>) -> tonic::metadata::MetadataMap {
    let mut m = tonic::metadata::MetadataMap::new();
    if let Some(v) = value {
        m.insert("authorization", v.parse().unwrap());
    }
    m
}

#[test]
fn a_known_key_maps_to_its_user() {
    let who = auth()
        .authenticate(&md(Some("Bearer secret-a")), None)
        .unwrap();
    assert_eq!(who.user_id, "alice");
    assert!(!who.admin);
}

#[test]
fn missing_malformed_and_unknown_keys_are_unauthenticated() {
    for value in [
        None,
        Some("secret-a"),
        Some("Bearer nope"),
        Some("Bearer secret-"),
    ] {
        let err = auth().authenticate(&md(value), None).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{value:?}");
    }
}

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    for value in [
        "Bearer secret-a",
        "bearer secret-a",
        "BEARER secret-a",
        "bEaReR secret-a",
    ] {
        let who = auth().authenticate(&md(Some(value)), None).unwrap();
        assert_eq!(who.user_id, "alice", "{value}");
    }
    for value in ["BEARER nope", "Basic secret-a", "Bearersecret-a"] {
        let err = auth().authenticate(&md(Some(value)), None).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{value}");
    }
}

#[test]
fn no_keys_means_the_local_user() {
    let who = Authenticator::new(&AuthConfig::default(), &no_env)
        .unwrap()
        .authenticate(&md(None), Some(&cert(Some("spiffe://test/bob"))))
        .unwrap();
    assert_eq!(who.user_id, "local");
}

#[test]
fn a_mapped_certificate_is_its_user_when_no_key_is_sent() {
    let who = auth()
        .authenticate(&md(None), Some(&cert(Some("spiffe://test/bob"))))
        .unwrap();
    assert_eq!((who.user_id.as_str(), who.admin), ("bob", true));
}

#[test]
fn a_bearer_key_takes_precedence_over_the_certificate() {
    let bob = cert(Some("spiffe://test/bob"));
    let who = auth()
        .authenticate(&md(Some("Bearer secret-a")), Some(&bob))
        .unwrap();
    assert_eq!(who.user_id, "alice");
    let err = auth()
        .authenticate(&md(Some("Bearer wrong-key")), Some(&bob))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
}

#[test]
fn an_unmapped_certificate_is_unauthenticated_naming_its_identity() {
    let err = auth()
        .authenticate(&md(None), Some(&cert(Some("spiffe://test/mallory"))))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(
        err.message().contains("URI SAN \"spiffe://test/mallory\"")
            && err.message().contains("[[auth.mtls]]"),
        "{}",
        err.message()
    );
    let err = auth()
        .authenticate(&md(None), Some(&cert(None)))
        .unwrap_err();
    assert!(
        err.message().contains("neither a URI SAN nor a subject CN"),
        "{}",
        err.message()
    );
    let who = auth()
        .authenticate(
            &md(Some("Bearer secret-a")),
            Some(&cert(Some("spiffe://test/mallory"))),
        )
        .unwrap();
    assert_eq!(who.user_id, "alice");
}

#[test]
fn keys_come_from_files_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, "from-the-file-key\n").unwrap();
    let config = AuthConfig {
        api_keys: vec![
            ApiKeyConfig {
                key: None,
                key_sha256: None,
                key_file: Some(file),
                key_env: None,
                user: "filed".into(),
                admin: false,
                restricted: false,
            },
            ApiKeyConfig {
                key: None,
                key_sha256: None,
                key_file: None,
                key_env: Some("AGENTRT_TEST_KEY".into()),
                user: "envy".into(),
                admin: false,
                restricted: false,
            },
        ],
        api_keys_file: None,
        mtls: Vec::new(),
    };
    let env = |name: &str| (name == "AGENTRT_TEST_KEY").then(|| "from-the-env-key".to_owned());
    let auth = Authenticator::new(&config, &env).unwrap();
    let who = auth
        .authenticate(&md(Some("Bearer from-the-file-key")), None)
        .unwrap();
    assert_eq!(who.user_id, "filed");
    let who = auth
        .authenticate(&md(Some("Bearer from-the-env-key")), None)
        .unwrap();
    assert_eq!(who.user_id, "envy");
}

fn hex(digest: [u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_hashed_key_authenticates_like_the_key() {
    let config = AuthConfig {
        api_keys: vec![
            ApiKeyConfig::hashed(hex(key_digest("hashed-secret-1")), "hal", true),
            ApiKeyConfig::inline("plain-secret-1", "pat", false),
        ],
        ..AuthConfig::default()
    };
    let auth = Authenticator::new(&config, &no_env).unwrap();
    let who = auth
        .authenticate(&md(Some("Bearer hashed-secret-1")), None)
        .unwrap();
    assert_eq!((who.user_id.as_str(), who.admin), ("hal", true));
    let who = auth
        .authenticate(&md(Some("Bearer plain-secret-1")), None)
        .unwrap();
    assert_eq!(who.user_id, "pat");
    // The digest itself is not a key.
    let digest = format!("Bearer {}", hex(key_digest("hashed-secret-1")));
    let err = auth.authenticate(&md(Some(&digest)), None).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(!format!("{auth:?}").contains("secret"));
}

#[test]
fn a_common_name_spelled_like_a_mapped_spiffe_id_is_not_that_user() {
    let spoof = named(&[], Some("spiffe://test/bob"));
    let err = auth().authenticate(&md(None), Some(&spoof)).unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert!(
        err.message().contains("subject CN \"spiffe://test/bob\""),
        "{}",
        err.message()
    );
    // A URI SAN spelled like a mapped CN is not that user either.
    let spoof = named(&["carol-cn:x"], None);
    assert!(auth().authenticate(&md(None), Some(&spoof)).is_err());
    // The CN maps only through a `cn` entry; the URI SAN wins when mapped.
    let who = auth()
        .authenticate(&md(None), Some(&named(&[], Some("carol-cn"))))
        .unwrap();
    assert_eq!(who.user_id, "carol");
    let who = auth()
        .authenticate(
            &md(None),
            Some(&named(&["spiffe://test/bob"], Some("carol-cn"))),
        )
        .unwrap();
    assert_eq!(who.user_id, "bob");
    let who = auth()
        .authenticate(
            &md(None),
            Some(&named(&["spiffe://test/unmapped"], Some("carol-cn"))),
        )
        .unwrap();
    assert_eq!(who.user_id, "carol");
}

#[test]
fn uri_sans_that_map_to_different_users_are_refused() {
    let config = AuthConfig {
        mtls: vec![
            MtlsConfig::uri("spiffe://test/bob", "bob", false),
            MtlsConfig::uri("spiffe://test/root", "root", true),
        ],
        ..AuthConfig::default()
    };
    let auth = Authenticator::new(&config, &no_env).unwrap();
    let both = named(&["spiffe://test/bob", "spiffe://test/root"], None);
    let err = auth.authenticate(&md(None), Some(&both)).unwrap_err();
    assert!(
        err.message().contains("different users"),
        "{}",
        err.message()
    );
}

#[test]
fn each_credential_gives_its_input_actor() {
    use agentrt_runtime::types::InputActor;
    let actor = |who: Principal| (who.actor.kind, who.actor.id);
    let by_key = auth()
        .authenticate(&md(Some("Bearer secret-a")), None)
        .unwrap();
    assert_eq!(actor(by_key), (ActorKind::ApiKey, "alice".to_owned()));
    let by_uri = auth()
        .authenticate(&md(None), Some(&cert(Some("spiffe://test/bob"))))
        .unwrap();
    assert_eq!(
        by_uri.input_actor(),
        InputActor {
            kind: ActorKind::Mtls,
            id: "spiffe://test/bob".to_owned(),
            admin: true,
        }
    );
    let by_cn = auth()
        .authenticate(&md(None), Some(&named(&[], Some("carol-cn"))))
        .unwrap();
    assert_eq!(actor(by_cn), (ActorKind::Mtls, "CN=carol-cn".to_owned()));
    let open = Authenticator::new(&AuthConfig::default(), &no_env)
        .unwrap()
        .authenticate(&md(None), None)
        .unwrap();
    assert_eq!(actor(open), (ActorKind::Local, "local".to_owned()));
}

#[test]
fn two_uri_sans_of_one_user_are_that_user_by_the_first() {
    let config = AuthConfig {
        mtls: vec![
            MtlsConfig::uri("spiffe://test/bob-a", "bob", false),
            MtlsConfig::uri("spiffe://test/bob-b", "bob", false),
        ],
        ..AuthConfig::default()
    };
    let auth = Authenticator::new(&config, &no_env).unwrap();
    let both = named(&["spiffe://test/bob-b", "spiffe://test/bob-a"], None);
    let who = auth.authenticate(&md(None), Some(&both)).unwrap();
    assert_eq!(
        (who.user_id.as_str(), who.actor.id.as_str()),
        ("bob", "spiffe://test/bob-b")
    );
}

#[test]
fn long_certificate_names_are_clipped_in_messages() {
    let long = format!("spiffe://test/{}", "x".repeat(10_000));
    let err = auth()
        .authenticate(&md(None), Some(&named(&[&long], Some(&long))))
        .unwrap_err();
    assert!(err.message().len() < 1024, "{}", err.message().len());
}

fn write_keys(path: &std::path::Path, entries: &[(&str, &str)]) {
    let text: String = entries
        .iter()
        .map(|(key, user)| format!("[[api_keys]]\nkey = \"{key}\"\nuser = \"{user}\"\n"))
        .collect();
    // Replaced whole, as a mounted Secret is.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn the_key_file_is_reloaded_when_it_changes_and_a_bad_version_keeps_the_old_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    write_keys(&path, &[("first-key-1", "first")]);
    let config = AuthConfig {
        api_keys: vec![ApiKeyConfig::inline("fixed-key-1", "fixed", false)],
        api_keys_file: Some(path.clone()),
        mtls: Vec::new(),
    };
    let auth = Authenticator::new(&config, &no_env).unwrap();
    let user = |key: &str| {
        auth.authenticate(&md(Some(&format!("Bearer {key}"))), None)
            .map(|p| p.user_id)
            .map_err(|s| s.code())
    };
    assert_eq!(user("first-key-1").unwrap(), "first");
    assert_eq!(user("fixed-key-1").unwrap(), "fixed");
    write_keys(&path, &[("second-key-1", "second")]);
    assert_eq!(user("second-key-1").unwrap(), "second");
    assert_eq!(user("first-key-1"), Err(tonic::Code::Unauthenticated));
    assert_eq!(user("fixed-key-1").unwrap(), "fixed");
    // Broken, duplicating a fixed key, or gone: the previous keys stay.
    std::fs::write(&path, "[[api_keys]]\nkey = \"third-key-1\" user\n").unwrap();
    assert_eq!(user("second-key-1").unwrap(), "second");
    write_keys(&path, &[("fixed-key-1", "dup")]);
    assert_eq!(user("second-key-1").unwrap(), "second");
    std::fs::remove_file(&path).unwrap();
    assert_eq!(user("second-key-1").unwrap(), "second");
    // An empty file: nobody, not the local user.
    write_keys(&path, &[]);
    assert_eq!(user("second-key-1"), Err(tonic::Code::Unauthenticated));
    assert_eq!(
        auth.authenticate(&md(None), None).unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    // SIGHUP's path re-reads even when nothing looks changed.
    write_keys(&path, &[("fourth-key-1", "fourth")]);
    auth.reload_keys("test");
    assert_eq!(user("fourth-key-1").unwrap(), "fourth");
}

#[test]
fn a_missing_or_bad_key_file_fails_start_up_without_showing_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.toml");
    let config = AuthConfig {
        api_keys_file: Some(path.clone()),
        ..AuthConfig::default()
    };
    let err = Authenticator::new(&config, &no_env).unwrap_err().0;
    assert!(err.contains("keys.toml"), "{err}");
    std::fs::write(
        &path,
        "[[api_keys]]\nkey = \"sk-do-not-show\" user = \"a\"\n",
    )
    .unwrap();
    let err = Authenticator::new(&config, &no_env).unwrap_err().0;
    assert!(
        err.contains("line 2") && !err.contains("sk-do-not-show"),
        "{err}"
    );
}

#[test]
fn restricted_keys_and_certificates_give_restricted_principals() {
    let guests = Authenticator::new(
        &AuthConfig {
            api_keys: vec![
                ApiKeyConfig::inline("guest-key-1", "guest", false).as_restricted(),
                ApiKeyConfig::inline("staff-key-1", "guest", false),
            ],
            api_keys_file: None,
            mtls: vec![MtlsConfig::common_name("kiosk", "kiosk", false).as_restricted()],
        },
        &no_env,
    )
    .unwrap();
    let guest = guests
        .authenticate(&md(Some("Bearer guest-key-1")), None)
        .unwrap();
    assert!(guest.restricted && !guest.admin);
    let staff = guests
        .authenticate(&md(Some("Bearer staff-key-1")), None)
        .unwrap();
    assert_eq!(staff.user_id, "guest");
    assert!(
        !staff.restricted,
        "restriction belongs to the key, not the user"
    );
    let kiosk = guests
        .authenticate(&md(None), Some(&cert(Some("kiosk"))))
        .unwrap();
    assert!(kiosk.restricted);
    assert!(
        !auth()
            .authenticate(&md(Some("Bearer secret-a")), None)
            .unwrap()
            .restricted
    );
}
