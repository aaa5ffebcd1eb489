//! Which Redis deployment Baton talks to, and how a connection to the right node is found.
//!
//! - **Standalone**: one Redis (`redis://host:port` or `unix:///path`).
//! - **Sentinel**: a master found through Sentinels; every new connection asks them for the
//!   current master (and checks its `ROLE`), so after a failover the next connection goes to the
//!   promoted replica.
//! - **Cluster**: seed nodes of a Redis Cluster; Baton reads the slot map from them and routes
//!   each script to the master owning its slot (see `cluster.rs`).

use std::{sync::Arc, time::Duration};

use bb8_redis::redis::{
    self, Client, RedisError,
    sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType},
};

use crate::error::Error;

/// The deployment named by the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// A single Redis server.
    Standalone {
        /// Its URL.
        url: String,
    },
    /// A Redis Cluster, found from any of its seed nodes.
    Cluster {
        /// Seed node URLs.
        seeds: Vec<String>,
    },
    /// A master monitored by Redis Sentinel.
    Sentinel {
        /// Sentinel URLs.
        sentinels: Vec<String>,
        /// The master's name in the Sentinels' configuration.
        master: String,
        /// Where the user, password and database of the connections to the master come from:
        /// the first Sentinel URL.
        node_url: Option<String>,
    },
}

impl Topology {
    /// Parses the `--redis-mode`, `--redis-url` (comma-separated for Cluster seeds or Sentinels)
    /// and `--redis-sentinel-master` settings, checking every URL.
    pub fn parse(mode: &str, urls: &str, sentinel_master: Option<&str>) -> Result<Self, String> {
        let list: Vec<String> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        if list.is_empty() {
            return Err("--redis-url / BATON_REDIS_URL: no URL given".to_owned());
        }
        for url in &list {
            if let Err(e) = Client::open(url.as_str()) {
                return Err(format!(
                    "--redis-url / BATON_REDIS_URL: {url:?} is not a Redis URL: {e}"
                ));
            }
        }
        let master = sentinel_master.map(str::trim).filter(|m| !m.is_empty());
        match mode {
            "standalone" => {
                if list.len() > 1 {
                    return Err("--redis-url / BATON_REDIS_URL: standalone mode takes one URL; use --redis-mode cluster or sentinel for a list".to_owned());
                }
                if master.is_some() {
                    return Err("--redis-sentinel-master / BATON_REDIS_SENTINEL_MASTER: only used with --redis-mode sentinel".to_owned());
                }
                Ok(Self::Standalone {
                    url: list.into_iter().next().unwrap_or_default(),
                })
            }
            "cluster" => {
                if master.is_some() {
                    return Err("--redis-sentinel-master / BATON_REDIS_SENTINEL_MASTER: only used with --redis-mode sentinel".to_owned());
                }
                Ok(Self::Cluster { seeds: list })
            }
            "sentinel" => {
                let Some(master) = master else {
                    return Err("--redis-sentinel-master / BATON_REDIS_SENTINEL_MASTER: required with --redis-mode sentinel".to_owned());
                };
                Ok(Self::Sentinel {
                    node_url: list.first().cloned(),
                    sentinels: list,
                    master: master.to_owned(),
                })
            }
            other => Err(format!(
                "--redis-mode / BATON_REDIS_MODE: {other:?} is not one of standalone, cluster, sentinel"
            )),
        }
    }

    /// A short name for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Standalone { .. } => "standalone",
            Self::Cluster { .. } => "cluster",
            Self::Sentinel { .. } => "sentinel",
        }
    }
}

/// Finds the node a non-cluster connection goes to: fixed for a standalone Redis, asked of the
/// Sentinels for every new connection otherwise. Cheap to clone.
#[derive(Clone)]
pub enum Endpoint {
    /// Always the same server.
    Fixed(Client),
    /// The current master, as the Sentinels report it.
    Sentinel(Arc<tokio::sync::Mutex<SentinelClient>>),
}

impl Endpoint {
    /// The endpoint of a standalone or Sentinel topology; `None` for a Cluster.
    pub fn new(topology: &Topology) -> Result<Option<Self>, Error> {
        match topology {
            Topology::Standalone { url } => Client::open(url.as_str())
                .map(|c| Some(Self::Fixed(c)))
                .map_err(|e| Error::Internal(format!("redis url: {e}"))),
            Topology::Cluster { .. } => Ok(None),
            Topology::Sentinel {
                sentinels,
                master,
                node_url,
            } => {
                let node = match node_url {
                    Some(url) => {
                        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                            .map_err(|e| Error::Internal(format!("redis url: {e}")))?;
                        SentinelNodeConnectionInfo::default()
                            .set_redis_connection_info(info.redis_settings().clone())
                    }
                    None => SentinelNodeConnectionInfo::default(),
                };
                let client = SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect::<Vec<_>>(),
                    master.clone(),
                    Some(node),
                    SentinelServerType::Master,
                )
                .map_err(|e| Error::Internal(format!("sentinel: {e}")))?;
                Ok(Some(Self::Sentinel(Arc::new(tokio::sync::Mutex::new(
                    client,
                )))))
            }
        }
    }

    /// A client for the node to connect to now, found within `limit`.
    pub async fn client(&self, limit: Duration) -> Result<Client, RedisError> {
        match self {
            Self::Fixed(client) => Ok(client.clone()),
            Self::Sentinel(sentinel) => {
                let find = async { sentinel.lock().await.async_get_client().await };
                match tokio::time::timeout(limit, find).await {
                    Ok(found) => found,
                    Err(_) => Err(RedisError::from((
                        redis::ErrorKind::Io,
                        "the Sentinels did not name a master in time",
                    ))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Topology;

    /// Each mode takes the URLs it needs and refuses the others' settings.
    #[test]
    fn modes_parse() {
        assert_eq!(
            Topology::parse("standalone", "redis://a:1", None),
            Ok(Topology::Standalone {
                url: "redis://a:1".into()
            })
        );
        assert_eq!(
            Topology::parse("cluster", "redis://a:1, redis://b:2", None),
            Ok(Topology::Cluster {
                seeds: vec!["redis://a:1".into(), "redis://b:2".into()]
            })
        );
        assert!(matches!(
            Topology::parse("sentinel", "redis://s:26379", Some("main")),
            Ok(Topology::Sentinel { master, .. }) if master == "main"
        ));
        assert!(Topology::parse("sentinel", "redis://s:26379", None).is_err());
        assert!(Topology::parse("standalone", "redis://a:1,redis://b:2", None).is_err());
        assert!(Topology::parse("standalone", "redis://a:1", Some("m")).is_err());
        assert!(Topology::parse("cluster", "nope://x", None).is_err());
        assert!(Topology::parse("mesh", "redis://a:1", None).is_err());
        assert!(Topology::parse("cluster", " , ", None).is_err());
    }
}
