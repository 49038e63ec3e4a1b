//! The agent card: who this agent is, where its gRPC interface listens,
//! what it can do and how callers authenticate — read off the server's
//! config and tools, never configured twice.

use std::collections::HashMap;
use std::net::SocketAddr;

use agentrt_proto::a2a::v1 as a2a;
use agentrt_runtime::Runtime;

use crate::config::Config;

/// The A2A protocol version this binding implements.
pub const PROTOCOL_VERSION: &str = "1.0";

/// The card of a server with `config`, listening on `addr`, running
/// `runtime`. Its interface URL is `[a2a] public_url` when set, else the
/// bound address (`host:port`, as gRPC clients take it).
pub fn agent_card(config: &Config, addr: Option<SocketAddr>, runtime: &Runtime) -> a2a::AgentCard {
    let url = config
        .a2a
        .public_url
        .clone()
        .unwrap_or_else(|| addr.unwrap_or(config.listen).to_string());
    let mut security_schemes = HashMap::new();
    if !config.auth.api_keys.is_empty() {
        security_schemes.insert(
            "bearer".to_owned(),
            a2a::SecurityScheme {
                scheme: Some(a2a::security_scheme::Scheme::HttpAuthSecurityScheme(
                    a2a::HttpAuthSecurityScheme {
                        description:
                            "an agentrt API key, sent as the `authorization: Bearer <key>` \
                                      metadata header"
                                .to_owned(),
                        scheme: "Bearer".to_owned(),
                        bearer_format: String::new(),
                    },
                )),
            },
        );
    }
    if config.tls.client_ca.is_some() {
        security_schemes.insert(
            "mtls".to_owned(),
            a2a::SecurityScheme {
                scheme: Some(a2a::security_scheme::Scheme::MtlsSecurityScheme(
                    a2a::MutualTlsSecurityScheme {
                        description: "a client certificate issued by the server's client CA and \
                                      mapped to a user by [[auth.mtls]]"
                            .to_owned(),
                    },
                )),
            },
        );
    }
    // Any one scheme is enough (A2A: the requirements are alternatives).
    let mut names: Vec<&String> = security_schemes.keys().collect();
    names.sort();
    let security_requirements = names
        .into_iter()
        .map(|name| a2a::SecurityRequirement {
            schemes: HashMap::from([(name.clone(), a2a::StringList::default())]),
        })
        .collect();
    let mut skills = vec![a2a::AgentSkill {
        id: "chat".to_owned(),
        name: "Chat".to_owned(),
        description: format!(
            "A conversation with the model {} (one context is one agentrt session; its history \
             is kept between messages)",
            config.default_model
        ),
        tags: vec!["chat".to_owned()],
        ..Default::default()
    }];
    let mut tools = runtime.toolbox().cached();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    skills.extend(tools.into_iter().map(|tool| a2a::AgentSkill {
        id: format!("tool:{}", tool.name),
        description: if tool.description.is_empty() {
            format!("the server tool {}", tool.name)
        } else {
            tool.description
        },
        name: tool.name,
        tags: vec!["tool".to_owned()],
        ..Default::default()
    }));
    a2a::AgentCard {
        name: "agentrt".to_owned(),
        description: "agentrt: AI-agent conversations with durable sessions, served over A2A \
                      (gRPC)"
            .to_owned(),
        supported_interfaces: vec![a2a::AgentInterface {
            url,
            protocol_binding: "GRPC".to_owned(),
            tenant: String::new(),
            protocol_version: PROTOCOL_VERSION.to_owned(),
        }],
        provider: None,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        documentation_url: None,
        capabilities: Some(a2a::AgentCapabilities {
            streaming: Some(true),
            push_notifications: Some(false),
            extensions: Vec::new(),
            extended_agent_card: Some(true),
            skill_query: Some(false),
        }),
        security_schemes,
        security_requirements,
        default_input_modes: vec!["text/plain".to_owned()],
        default_output_modes: vec!["text/plain".to_owned()],
        skills,
        signatures: Vec::new(),
        icon_url: None,
    }
}

/// The path A2A clients read an agent's public card from (RFC 8615
/// well-known URI, A2A's discovery section).
pub const WELL_KNOWN_PATH: &str = "/.well-known/agent-card.json";

/// `card` as the public card, in the protobuf JSON mapping A2A clients
/// parse (camelCase names, unset fields left out): the extended card
/// without the server tools' skills, which only callers with credentials
/// see (through `GetExtendedAgentCard`; the card says so with
/// `capabilities.extendedAgentCard`).
pub fn public_card_json(card: &a2a::AgentCard) -> String {
    use serde_json::{Map, Value, json};
    let interfaces: Vec<Value> = card
        .supported_interfaces
        .iter()
        .map(|i| {
            let mut v = json!({
                "url": i.url,
                "protocolBinding": i.protocol_binding,
                "protocolVersion": i.protocol_version,
            });
            if !i.tenant.is_empty() {
                v["tenant"] = json!(i.tenant);
            }
            v
        })
        .collect();
    let mut capabilities = Map::new();
    if let Some(c) = &card.capabilities {
        for (key, value) in [
            ("streaming", c.streaming),
            ("pushNotifications", c.push_notifications),
            ("extendedAgentCard", c.extended_agent_card),
            ("skillQuery", c.skill_query),
        ] {
            if let Some(value) = value {
                capabilities.insert(key.to_owned(), json!(value));
            }
        }
    }
    let mut schemes = Map::new();
    for (name, scheme) in &card.security_schemes {
        use a2a::security_scheme::Scheme;
        let value = match &scheme.scheme {
            Some(Scheme::HttpAuthSecurityScheme(h)) => {
                let mut v = json!({"scheme": h.scheme, "description": h.description});
                if !h.bearer_format.is_empty() {
                    v["bearerFormat"] = json!(h.bearer_format);
                }
                json!({"httpAuthSecurityScheme": v})
            }
            Some(Scheme::MtlsSecurityScheme(m)) => {
                json!({"mtlsSecurityScheme": {"description": m.description}})
            }
            // Never on agentrt's card (see `agent_card`).
            Some(
                Scheme::ApiKeySecurityScheme(_)
                | Scheme::Oauth2SecurityScheme(_)
                | Scheme::OpenIdConnectSecurityScheme(_),
            )
            | None => continue,
        };
        schemes.insert(name.clone(), value);
    }
    let requirements: Vec<Value> = card
        .security_requirements
        .iter()
        .map(|r| {
            let schemes: Map<String, Value> = r
                .schemes
                .iter()
                .map(|(k, v)| (k.clone(), json!({"list": v.list})))
                .collect();
            json!({"schemes": schemes})
        })
        .collect();
    let skills: Vec<Value> = card
        .skills
        .iter()
        .filter(|s| !s.tags.iter().any(|t| t == "tool"))
        .map(|s| {
            json!({
                "id": s.id,
                "name": s.name,
                "description": s.description,
                "tags": s.tags,
            })
        })
        .collect();
    let mut out = json!({
        "name": card.name,
        "description": card.description,
        "supportedInterfaces": interfaces,
        "version": card.version,
        "capabilities": capabilities,
        "defaultInputModes": card.default_input_modes,
        "defaultOutputModes": card.default_output_modes,
        "skills": skills,
    });
    if !schemes.is_empty() {
        out["securitySchemes"] = Value::Object(schemes);
        out["securityRequirements"] = json!(requirements);
    }
    out.to_string()
}
