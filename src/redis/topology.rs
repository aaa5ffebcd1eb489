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

use crate::{config::Topology, error::Error};

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
