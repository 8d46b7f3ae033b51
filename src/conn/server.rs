//! The server a client talks to: what it calls itself and its version, asked once at connect,
//! and what redbaton refuses to do on it.

use std::fmt;

use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::config::PubSubMode;
use crate::{Error, Result};

/// The oldest Redis redbaton connects to: the oldest one its tests run against (6.2.14).
pub const OLDEST_REDIS: (u32, u32, u32) = (6, 2, 0);

/// The first Redis with sharded pub/sub (`SSUBSCRIBE`, `SPUBLISH`, `PUBSUB SHARDNUMSUB`).
const SHARDED_PUBSUB_REDIS: (u32, u32, u32) = (7, 0, 0);

/// What the server a [`Client`](crate::Client) is connected to says it is, at connect (`HELLO`,
/// or `INFO server` on a server without it). On a cluster, the node first asked; on Sentinel,
/// the primary.
///
/// ```no_run
/// # async fn run() -> redbaton::Result<()> {
/// let client = redbaton::Client::connect("redis://127.0.0.1:6379").await?;
/// if let Some(server) = client.server() {
///     println!("connected to {server}"); // e.g. "Redis 7.0.15" or "Valkey 8.1.8"
/// }
/// # client.shutdown().await }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerVersion {
    /// The server's own name for itself, lower case: `redis`, `valkey`, or another that speaks
    /// the protocol; `None` when it did not say (its version is then read as a Redis one).
    pub name: Option<String>,
    /// Major, minor and patch numbers.
    pub version: (u32, u32, u32),
}

impl ServerVersion {
    /// Whether the server is Valkey (which starts at 7.2 and has everything redbaton uses).
    pub fn is_valkey(&self) -> bool {
        self.name.as_deref() == Some("valkey")
    }

    /// Reads `HELLO`'s reply: `server` and `version` among its fields (a flat array of field
    /// and value in RESP2, or a map).
    pub(crate) fn from_hello(reply: &Value) -> Option<ServerVersion> {
        let pairs: Vec<(String, String)> = match reply {
            Value::Array(items) => items
                .chunks(2)
                .filter_map(|pair| Some((pair[0].as_string()?, pair.get(1)?.as_string()?)))
                .collect(),
            Value::Map(map) => map
                .iter()
                .filter_map(|(k, v)| Some((k.as_str()?.to_string(), v.as_string()?)))
                .collect(),
            _ => return None,
        };
        let field = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        Some(ServerVersion {
            name: field("server").map(|n| n.to_lowercase()),
            version: parse_version(field("version")?)?,
        })
    }

    /// Reads `INFO server`: `valkey_version` and `server_name` on Valkey, else
    /// `redis_version` (which Valkey also gives, as the Redis version it is compatible with).
    pub(crate) fn from_info(info: &str) -> Option<ServerVersion> {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.trim_end().strip_prefix(name)?.strip_prefix(':'))
        };
        if let Some(version) = field("valkey_version").and_then(parse_version) {
            return Some(ServerVersion {
                name: Some("valkey".to_owned()),
                version,
            });
        }
        Some(ServerVersion {
            name: field("server_name").map(str::to_lowercase),
            version: parse_version(field("redis_version")?)?,
        })
    }

    fn redis_compatible(&self) -> bool {
        !self.is_valkey()
    }

    /// Refuses what this server cannot serve: a Redis older than [`OLDEST_REDIS`], and sharded
    /// pub/sub before Redis 7.0. `url` (redacted) names the server in the message.
    pub(crate) fn check(&self, pubsub: PubSubMode, url: &str) -> Result<()> {
        let unsupported = |detail: String| {
            Err(Error::Unsupported {
                server: format!("{self} at {url}"),
                detail,
            })
        };
        if self.redis_compatible() && self.version < OLDEST_REDIS {
            let (major, minor, _) = OLDEST_REDIS;
            return unsupported(format!(
                "older than the oldest supported server, Redis {major}.{minor} (or any Valkey)"
            ));
        }
        if pubsub == PubSubMode::Sharded
            && self.redis_compatible()
            && self.version < SHARDED_PUBSUB_REDIS
        {
            return unsupported(
                "PubSubMode::Sharded needs SSUBSCRIBE, SPUBLISH and PUBSUB SHARDNUMSUB, which came \
                 with Redis 7.0; use PubSubMode::Classic (the default) on this server"
                    .to_owned(),
            );
        }
        Ok(())
    }
}

impl fmt::Display for ServerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.name.as_deref() {
            None | Some("redis") => "Redis",
            Some("valkey") => "Valkey",
            Some(other) => other,
        };
        let (major, minor, patch) = self.version;
        write!(f, "{name} {major}.{minor}.{patch}")
    }
}

/// Asks the server what it is: `HELLO 2` (Redis 6.0 and later; any user may send it, whatever
/// its ACL, and the connection stays on RESP2), else `INFO server`. `Ok(None)` when it refused
/// both (commands renamed away); an error only when the connection failed.
pub(crate) async fn ask(
    redis: &fred::clients::Client,
) -> Result<Option<ServerVersion>, fred::error::Error> {
    use fred::error::ErrorKind;
    let send = |name: &'static str, arg: &'static str| {
        redis.custom::<Value, _>(
            CustomCommand::new_static(name, ClusterHash::Random, false),
            vec![arg],
        )
    };
    let transport = |e: &fred::error::Error| {
        matches!(
            e.kind(),
            ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled | ErrorKind::Routing
        )
    };
    match send("HELLO", "2").await {
        Ok(reply) => {
            if let Some(server) = ServerVersion::from_hello(&reply) {
                return Ok(Some(server));
            }
        }
        Err(e) if transport(&e) => return Err(e),
        Err(_) => {}
    }
    match send("INFO", "server").await {
        Ok(reply) => Ok(reply
            .as_string()
            .as_deref()
            .and_then(ServerVersion::from_info)),
        Err(e) if transport(&e) => Err(e),
        Err(_) => Ok(None),
    }
}

/// `7.0.15` → `(7, 0, 15)`; a missing patch is 0, anything after a `-` is ignored.
fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    let mut numbers = text.trim().split(['.', '-']).map(str::parse::<u32>);
    let major = numbers.next()?.ok()?;
    let minor = numbers.next()?.ok()?;
    let patch = numbers.next().and_then(|n| n.ok()).unwrap_or(0);
    Some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::String(s.into())
    }

    fn redis(version: (u32, u32, u32)) -> ServerVersion {
        ServerVersion {
            name: Some("redis".into()),
            version,
        }
    }

    #[test]
    fn hello_replies_are_read() {
        let reply = Value::Array(vec![
            bulk("server"),
            bulk("valkey"),
            bulk("version"),
            bulk("8.1.8"),
            bulk("proto"),
            Value::Integer(2),
            bulk("modules"),
            Value::Array(vec![]),
        ]);
        let server = ServerVersion::from_hello(&reply).unwrap();
        assert!(server.is_valkey());
        assert_eq!(server.version, (8, 1, 8));
        assert_eq!(server.to_string(), "Valkey 8.1.8");
        assert_eq!(ServerVersion::from_hello(&Value::Integer(1)), None);
        assert_eq!(
            ServerVersion::from_hello(&Value::Array(vec![bulk("server"), bulk("redis")])),
            None,
            "no version"
        );
    }

    #[test]
    fn info_replies_are_read() {
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n";
        assert_eq!(
            ServerVersion::from_info(valkey).unwrap().to_string(),
            "Valkey 8.1.8"
        );
        let redis = "# Server\r\nredis_version:5.0.14\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(
            ServerVersion::from_info(redis).unwrap(),
            ServerVersion {
                name: None,
                version: (5, 0, 14)
            }
        );
        assert_eq!(ServerVersion::from_info("# Server\r\n"), None);
    }

    #[test]
    fn versions_are_parsed() {
        assert_eq!(parse_version("7.0.15"), Some((7, 0, 15)));
        assert_eq!(parse_version("6.2"), Some((6, 2, 0)));
        assert_eq!(parse_version("7.2.0-rc1"), Some((7, 2, 0)));
        assert_eq!(parse_version("seven"), None);
    }

    /// A server older than the oldest supported one is refused, its version in the message.
    #[test]
    fn old_servers_are_refused_with_their_version() {
        for version in [(6, 0, 20), (5, 0, 14), (4, 0, 0)] {
            match redis(version).check(PubSubMode::Classic, "redis://h:6379") {
                Err(Error::Unsupported { server, detail }) => {
                    let (a, b, c) = version;
                    assert_eq!(server, format!("Redis {a}.{b}.{c} at redis://h:6379"));
                    assert!(detail.contains("Redis 6.2"), "{detail}");
                }
                other => panic!("{version:?}: {other:?}"),
            }
        }
        for version in [(6, 2, 0), (6, 2, 14), (7, 0, 15), (8, 0, 0)] {
            assert_eq!(redis(version).check(PubSubMode::Classic, "u"), Ok(()));
        }
    }

    /// Sharded pub/sub needs Redis 7.0 (or Valkey); on 6.2 it is refused by name.
    #[test]
    fn sharded_pubsub_needs_redis_7() {
        let err = redis((6, 2, 14))
            .check(PubSubMode::Sharded, "u")
            .unwrap_err();
        assert!(
            matches!(&err, Error::Unsupported { detail, .. } if detail.contains("SSUBSCRIBE")),
            "{err:?}"
        );
        assert_eq!(redis((7, 0, 0)).check(PubSubMode::Sharded, "u"), Ok(()));
        let valkey = ServerVersion {
            name: Some("valkey".into()),
            version: (7, 2, 4),
        };
        assert_eq!(valkey.check(PubSubMode::Sharded, "u"), Ok(()));
    }
}
