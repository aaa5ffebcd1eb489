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
    self, Client, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, RedisError, TlsMode,
    sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType},
};

use super::access::{Access, Snapshot};
use crate::{
    config::{RedisAccess, Topology},
    error::Error,
};

/// Finds the node a non-cluster connection goes to: fixed for a standalone Redis (or one Cluster
/// master), asked of the Sentinels for every new connection otherwise. Either way the
/// connection takes the user, password and TLS settings of the moment ([`Access`]). Cheap to
/// clone.
#[derive(Clone)]
pub enum Endpoint {
    /// Always the same server.
    Fixed {
        /// Its address, database and the URL's own credentials.
        info: Arc<ConnectionInfo>,
        /// The settings of the moment, put over `info`.
        access: Arc<Access>,
    },
    /// The current master, as the Sentinels report it.
    Sentinel(Arc<Sentinels>),
}

/// The Sentinels of a master, and a Sentinel client built with the settings of the moment
/// (built again when a password or TLS file changed).
pub struct Sentinels {
    /// The Sentinels' addresses and the first URL's credentials and database.
    sentinels: Vec<ConnectionInfo>,
    /// The master's name.
    master: String,
    /// The database and credentials of connections to the master (from the first URL).
    node: RedisConnectionInfo,
    /// Whether the Sentinels and the master are reached over TLS (`rediss://`).
    tls: bool,
    access: Arc<Access>,
    client: tokio::sync::Mutex<Option<(u64, SentinelClient)>>,
}

impl Sentinels {
    /// A Sentinel client for the settings of `snapshot`.
    fn build(&self, snapshot: &Snapshot) -> Result<SentinelClient, RedisError> {
        let (flag_user, flag_password) = snapshot.credentials();
        let user = flag_user.or(self.node.username());
        let password = flag_password.or(self.node.password());
        let addrs = self
            .sentinels
            .iter()
            .map(|info| snapshot.apply(info.clone()).addr().clone());
        let mut builder =
            SentinelClientBuilder::new(addrs, &self.master, SentinelServerType::Master)?
                .set_client_to_redis_db(self.node.db())
                .set_client_to_redis_protocol(self.node.protocol());
        if let Some(user) = user {
            builder = builder
                .set_client_to_sentinel_username(user)
                .set_client_to_redis_username(user);
        }
        if let Some(password) = password {
            builder = builder
                .set_client_to_sentinel_password(password)
                .set_client_to_redis_password(password);
        }
        if self.tls {
            if snapshot.insecure() {
                builder = builder.set_client_to_redis_tls_mode(TlsMode::Insecure);
            } else {
                builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
                if let Some(certificates) = snapshot.certificates() {
                    builder = builder.set_client_to_redis_certificates(certificates.clone());
                }
            }
        }
        builder.build()
    }

    /// A client for the master the Sentinels name now.
    async fn master(&self) -> Result<Client, RedisError> {
        let snapshot = self.access.snapshot();
        let mut client = self.client.lock().await;
        let current = match client.as_mut() {
            Some((generation, sentinel)) if *generation == snapshot.generation => sentinel,
            _ => {
                &mut client
                    .insert((snapshot.generation, self.build(&snapshot)?))
                    .1
            }
        };
        let found = current.async_get_client().await.map_err(|e| {
            if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel {
                // The Sentinels also say so of a master they know but see down (not yet failed
                // over): say both, so that an operator does not only look for a wrong name.
                RedisError::from((
                    redis::ErrorKind::MasterNameNotFoundBySentinel,
                    "no Sentinel names a master in good health for this name: the name is not \
                     one they monitor (--redis-sentinel-master), or its master is down and not \
                     failed over yet",
                ))
            } else {
                e
            }
        })?;
        Client::open(snapshot.apply(found.get_connection_info().clone()))
    }
}

impl Endpoint {
    /// The endpoint of a standalone or Sentinel topology, with the URLs' own credentials and
    /// no TLS settings; `None` for a Cluster.
    pub fn new(topology: &Topology) -> Result<Option<Self>, Error> {
        let access = Access::load(&RedisAccess::default())
            .map_err(|problems| Error::Internal(problems.join("; ")))?;
        Self::with_access(topology, Arc::new(access))
    }

    /// The endpoint of a standalone or Sentinel topology, its connections set up by `access`;
    /// `None` for a Cluster.
    pub fn with_access(topology: &Topology, access: Arc<Access>) -> Result<Option<Self>, Error> {
        let parse = |url: &str| {
            url.into_connection_info()
                .map_err(|e| Error::Internal(format!("redis url: {e}")))
        };
        match topology {
            Topology::Standalone { url } => Ok(Some(Self::Fixed {
                info: Arc::new(parse(url)?),
                access,
            })),
            Topology::Cluster { .. } => Ok(None),
            Topology::Sentinel {
                sentinels,
                master,
                node_url,
            } => {
                let sentinels = sentinels
                    .iter()
                    .map(|u| parse(u))
                    .collect::<Result<Vec<_>, _>>()?;
                let node = match node_url {
                    Some(url) => parse(url)?.redis_settings().clone(),
                    None => RedisConnectionInfo::default(),
                };
                let tls = sentinels
                    .iter()
                    .any(|i| matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. }));
                Ok(Some(Self::Sentinel(Arc::new(Sentinels {
                    sentinels,
                    master: master.clone(),
                    node,
                    tls,
                    access,
                    client: tokio::sync::Mutex::new(None),
                }))))
            }
        }
    }

    /// A client for the node to connect to now, found within `limit`, with the user, password
    /// and TLS settings of the moment.
    pub async fn client(&self, limit: Duration) -> Result<Client, RedisError> {
        match self {
            Self::Fixed { info, access } => {
                Client::open(access.snapshot().apply(ConnectionInfo::clone(info)))
            }
            Self::Sentinel(sentinels) => {
                match tokio::time::timeout(limit, sentinels.master()).await {
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
