//! Sentinel: a master, one replica and three Sentinels watching them.

use super::*;

// ---------------------------------------------------------------------------------------------
// Sentinel
// ---------------------------------------------------------------------------------------------

/// How quickly the Sentinels of a [`SentinelDeployment`] act.
#[derive(Clone, Copy, Debug)]
pub struct SentinelTimings {
    /// `down-after-milliseconds`: how long the master may not answer before a Sentinel
    /// considers it down.
    pub down_after: Duration,
    /// `failover-timeout`: bounds each failover step, the leader election, and the wait before
    /// another failover of the same master is tried.
    pub failover_timeout: Duration,
}

impl Default for SentinelTimings {
    /// Fast but stable failover: 1 s down-after, 3 s failover timeout. From SIGKILL of the master
    /// to a Sentinel naming the promoted replica (median of 5 on a loaded 2-core machine):
    /// 2.14 s with 500 ms down-after, 2.31 s with 1 s, 3.28 s with 2 s. About 1.3 s of it is
    /// fixed by Redis (leader election, then the 1 s INFO period that sees the promotion), so
    /// 500 ms buys little and risks spurious failovers when a loaded machine stalls a process.
    /// The failover timeout bounds the election; a failed one is retried after twice this.
    fn default() -> Self {
        Self {
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(3000),
        }
    }
}

/// A master, one replica (`--replicaof`) and three Sentinels monitoring them with quorum 2, all
/// on 127.0.0.1, without persistence. Every process is killed by pid on drop.
pub struct SentinelDeployment {
    // Declared before the temp dir: processes are killed before their directories go.
    /// The two data nodes; `master` indexes the current master among them.
    data: Vec<Process>,
    sentinels: Vec<Process>,
    master: usize,
    master_name: String,
    dir: tempfile::TempDir,
}

impl SentinelDeployment {
    /// The name the Sentinels monitor the master under.
    pub const MASTER_NAME: &'static str = "baton";

    /// Starts the deployment with [`SentinelTimings::default`].
    pub async fn start() -> Self {
        Self::start_with(SentinelTimings::default()).await
    }

    /// Starts the master, then the replica, waits for their first sync, starts the Sentinels,
    /// and waits until every Sentinel sees the master up, the replica with its link up, and the
    /// two other Sentinels.
    pub async fn start_with(timings: SentinelTimings) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("baton-sentinel-")
            .tempdir()
            .expect("creating a temp dir for the sentinel deployment");
        let master = start_process(dir.path(), "master", free_port, base_args).await;
        let master_port = master.port;
        let replica = start_process(dir.path(), "replica", free_port, |port, dir| {
            let mut args = base_args(port, dir);
            args.extend(["--replicaof", "127.0.0.1", &master_port.to_string()].map(OsString::from));
            args
        })
        .await;
        let replica_port = replica.port;
        let mut deployment = Self {
            data: vec![master, replica],
            sentinels: Vec::new(),
            master: 0,
            master_name: Self::MASTER_NAME.to_owned(),
            dir,
        };
        // Sentinels learn about replicas from the master's INFO, which they read when they
        // connect and then only every 10 s: start them once the replica is attached.
        deployment
            .wait_replica_linked(replica_port, master_port, REPLICATION_TIMEOUT)
            .await;
        for _ in 0..3 {
            let name = deployment.master_name.clone();
            let sentinel =
                start_process(deployment.dir.path(), "sentinel", free_port, |port, dir| {
                    let conf = dir.join("sentinel.conf");
                    let text = format!(
                        "port {port}\n\
                     bind 127.0.0.1\n\
                     dir {dir}\n\
                     logfile {log}\n\
                     sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {name} {down}\n\
                     sentinel failover-timeout {name} {failover}\n\
                     sentinel parallel-syncs {name} 1\n",
                        dir = dir.display(),
                        log = dir.join("redis.log").display(),
                        down = timings.down_after.as_millis(),
                        failover = timings.failover_timeout.as_millis(),
                    );
                    std::fs::write(&conf, text).expect("writing sentinel.conf");
                    vec![conf.into(), "--sentinel".into()]
                })
                .await;
            deployment.sentinels.push(sentinel);
        }
        deployment.wait_sentinels_ready().await;
        deployment
    }

    /// Waits until the replica on `replica_port` reports its link to `master_port` up.
    async fn wait_replica_linked(&self, replica_port: u16, master_port: u16, limit: Duration) {
        let linked = poll(limit, || async move {
            let repl: String = query(replica_port, redis::cmd("INFO").arg("replication")).await?;
            let master = info_field(&repl, "master_port").unwrap_or("?");
            let link = info_field(&repl, "master_link_status").unwrap_or("?");
            if master == master_port.to_string() && link == "up" {
                Ok(())
            } else {
                Err(format!(
                    "replica 127.0.0.1:{replica_port}: master_port:{master} link:{link}"
                ))
            }
        })
        .await;
        if let Err(last) = linked {
            panic!(
                "the replica did not sync with 127.0.0.1:{master_port} within {limit:?}: \
                 {last}\n{}",
                self.logs()
            );
        }
    }

    async fn wait_sentinels_ready(&self) {
        let name = self.master_name.clone();
        let master_port = self.data[self.master].port;
        let ports: Vec<u16> = self.sentinels.iter().map(|s| s.port).collect();
        let others = ports.len() - 1;
        let ready = poll(SENTINEL_READY_TIMEOUT, || {
            let (name, ports) = (name.clone(), ports.clone());
            async move {
                for port in ports {
                    let master: HashMap<String, String> =
                        query(port, redis::cmd("SENTINEL").arg("MASTER").arg(&name)).await?;
                    let field = |f: &str| master.get(f).map_or("?", String::as_str);
                    if field("flags") != "master"
                        || field("port") != master_port.to_string()
                        || field("num-slaves") != "1"
                        || field("num-other-sentinels") != others.to_string()
                    {
                        return Err(format!(
                            "sentinel 127.0.0.1:{port}: flags {} port {} num-slaves {} \
                             num-other-sentinels {}",
                            field("flags"),
                            field("port"),
                            field("num-slaves"),
                            field("num-other-sentinels")
                        ));
                    }
                    let replicas: Vec<HashMap<String, String>> =
                        query(port, redis::cmd("SENTINEL").arg("REPLICAS").arg(&name)).await?;
                    let healthy = replicas.iter().any(|r| {
                        r.get("flags").map(String::as_str) == Some("slave")
                            && r.get("master-link-status").map(String::as_str) == Some("ok")
                    });
                    if !healthy {
                        return Err(format!("sentinel 127.0.0.1:{port}: replicas {replicas:?}"));
                    }
                }
                Ok(())
            }
        })
        .await;
        if let Err(last) = ready {
            panic!(
                "the sentinels did not see the master, the replica and each other within \
                 {SENTINEL_READY_TIMEOUT:?}: {last}\n{}",
                self.logs()
            );
        }
    }

    /// `redis://127.0.0.1:PORT` of each Sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| url(s.port)).collect()
    }

    /// The name the Sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The master's address: the first one a Sentinel gives (`SENTINEL
    /// GET-MASTER-ADDR-BY-NAME`) whose server answers `ROLE` as a master, as a Sentinel-aware
    /// client finds it. Right after a failover some Sentinels may still name the old master.
    pub async fn master_addr(&self) -> SocketAddr {
        let mut errors = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| s.running()) {
            let addr = match addr_from(sentinel.port, &self.master_name).await {
                Ok(addr) => addr,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            match role(addr.port()).await {
                Ok(r) if r == "master" => return addr,
                other => errors.push(format!(
                    "sentinel {}: {addr} has role {other:?}",
                    sentinel.port
                )),
            }
        }
        panic!("no sentinel named a reachable master: {errors:?}");
    }

    /// The process id of the current master (as last seen by [`Self::wait_for_failover`]).
    pub fn master_pid(&self) -> Option<u32> {
        self.data[self.master].pid()
    }

    /// The process id of the data node that is not the current master.
    pub fn replica_pid(&self) -> Option<u32> {
        self.data[1 - self.master].pid()
    }

    /// The process ids of the running Sentinels.
    pub fn sentinel_pids(&self) -> Vec<u32> {
        self.sentinels.iter().filter_map(Process::pid).collect()
    }

    /// The process ids of every running process of the deployment.
    pub fn pids(&self) -> Vec<u32> {
        self.data
            .iter()
            .chain(&self.sentinels)
            .filter_map(Process::pid)
            .collect()
    }

    /// Kills the current master (SIGKILL, as a crash would); returns its address.
    pub fn kill_master(&mut self) -> SocketAddr {
        let master = &mut self.data[self.master];
        assert!(master.running(), "the master was already killed");
        master.kill();
        SocketAddr::from(([127, 0, 0, 1], master.port))
    }

    /// Polls the Sentinels (at most `limit`) until the failover is over as a Sentinel-aware
    /// client sees it: a Sentinel's `SENTINEL MASTER` names a new address, not flagged down (the
    /// check redis-rs's `SentinelClient` makes), and the server there answers `ROLE` as a
    /// master. Returns that address; panics with the logs otherwise.
    ///
    /// `GET-MASTER-ADDR-BY-NAME` names the promoted replica a little earlier, while the leader
    /// Sentinel is still reconfiguring replicas; `SENTINEL MASTER` (and redis-rs) only once the
    /// leader announces `+switch-master`.
    pub async fn wait_for_failover(&mut self, limit: Duration) -> SocketAddr {
        let old = self.data[self.master].port;
        let name = self.master_name.clone();
        let ports: Vec<u16> = self
            .sentinels
            .iter()
            .filter(|s| s.running())
            .map(|s| s.port)
            .collect();
        let found = poll(limit, || {
            let (name, ports) = (name.clone(), ports.clone());
            async move {
                let mut seen = Vec::new();
                for port in ports {
                    let master: HashMap<String, String> =
                        match query(port, redis::cmd("SENTINEL").arg("MASTER").arg(&name)).await {
                            Ok(master) => master,
                            Err(e) => {
                                seen.push(e);
                                continue;
                            }
                        };
                    let field = |f: &str| master.get(f).map_or("?", String::as_str);
                    let flags = field("flags");
                    let addr: Option<SocketAddr> =
                        format!("{}:{}", field("ip"), field("port")).parse().ok();
                    let Some(addr) = addr.filter(|a| a.port() != old) else {
                        seen.push(format!("sentinel {port}: still {old} ({flags})"));
                        continue;
                    };
                    if !flags.split(',').any(|f| f == "master")
                        || flags.contains("s_down")
                        || flags.contains("o_down")
                    {
                        seen.push(format!("sentinel {port}: {addr} flagged {flags}"));
                        continue;
                    }
                    match role(addr.port()).await {
                        Ok(r) if r == "master" => return Ok(addr),
                        other => seen.push(format!("sentinel {port}: {addr} has role {other:?}")),
                    }
                }
                Err(seen.join("; "))
            }
        })
        .await;
        let addr = found
            .unwrap_or_else(|last| panic!("no failover within {limit:?}: {last}\n{}", self.logs()));
        self.master = self
            .data
            .iter()
            .position(|d| d.port == addr.port())
            .unwrap_or_else(|| panic!("the sentinels promoted {addr}, which is not ours"));
        addr
    }

    /// Asks the first Sentinel for a manual failover (`SENTINEL FAILOVER`): the replica is
    /// promoted while the old master keeps running, and still says it is the master until the
    /// Sentinels turn it into a replica (at their next `INFO` of it, up to 10 s later). Returns
    /// the old master's address; [`Self::wait_for_failover`] then waits for the promotion.
    pub async fn manual_failover(&self) -> SocketAddr {
        let port = self.sentinels[0].port;
        let _: String = query(
            port,
            redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(&self.master_name),
        )
        .await
        .unwrap_or_else(|e| panic!("SENTINEL FAILOVER on {port}: {e}"));
        SocketAddr::from(([127, 0, 0, 1], self.data[self.master].port))
    }

    /// Restarts the killed data node on its old port as a replica of the current master (with
    /// no data: nothing is saved), and waits until it has synced and every Sentinel lists it as
    /// a replica that is not down.
    pub async fn restart_old_master_as_replica(&mut self) {
        let old = 1 - self.master;
        let master_port = self.data[self.master].port;
        assert!(
            !self.data[old].running(),
            "the old master is still running: kill it and wait for the failover first"
        );
        let process = &mut self.data[old];
        let mut args = base_args(process.port, &process.dir);
        args.extend(["--replicaof", "127.0.0.1", &master_port.to_string()].map(OsString::from));
        process.relaunch(args).await;
        let replica_port = process.port;
        self.wait_replica_linked(replica_port, master_port, REPLICATION_TIMEOUT)
            .await;
        let name = self.master_name.clone();
        let ports: Vec<u16> = self.sentinels.iter().map(|s| s.port).collect();
        let seen = poll(SENTINEL_READY_TIMEOUT, || {
            let (name, ports) = (name.clone(), ports.clone());
            async move {
                for port in ports {
                    let replicas: Vec<HashMap<String, String>> =
                        query(port, redis::cmd("SENTINEL").arg("REPLICAS").arg(&name)).await?;
                    let listed = replicas.iter().any(|r| {
                        r.get("port") == Some(&replica_port.to_string())
                            && r.get("flags").map(String::as_str) == Some("slave")
                    });
                    if !listed {
                        return Err(format!("sentinel {port}: replicas {replicas:?}"));
                    }
                }
                Ok(())
            }
        })
        .await;
        if let Err(last) = seen {
            panic!(
                "the sentinels did not see 127.0.0.1:{replica_port} back as a replica within \
                 {SENTINEL_READY_TIMEOUT:?}: {last}\n{}",
                self.logs()
            );
        }
    }

    /// A multiplexed connection to the current master (its address asked of a Sentinel).
    pub async fn master_client(&self) -> MultiplexedConnection {
        let addr = self.master_addr().await;
        connect(addr.port())
            .await
            .unwrap_or_else(|e| panic!("master client: {e}"))
    }

    /// A redis-rs Sentinel client for the master, as an application would connect.
    pub fn sentinel_client(&self) -> SentinelClient {
        SentinelClient::build(
            self.sentinel_urls(),
            self.master_name.clone(),
            None,
            SentinelServerType::Master,
        )
        .expect("sentinel client")
    }

    /// Everything the processes logged, for failure messages.
    pub fn logs(&self) -> String {
        self.data
            .iter()
            .chain(&self.sentinels)
            .map(|p| format!("--- 127.0.0.1:{} ---\n{}", p.port, p.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for SentinelDeployment {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for p in self.data.iter().chain(&self.sentinels) {
                eprintln!(
                    "--- sentinel deployment 127.0.0.1:{} (last lines) ---\n{}",
                    p.port,
                    p.log_tail(15)
                );
            }
        }
        for p in self.sentinels.iter_mut().chain(self.data.iter_mut()) {
            p.kill();
        }
    }
}

/// The master address the Sentinel on `sentinel_port` gives for `name`.
async fn addr_from(sentinel_port: u16, name: &str) -> Result<SocketAddr, String> {
    let reply: Option<(String, u16)> = query(
        sentinel_port,
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name),
    )
    .await?;
    let (ip, port) =
        reply.ok_or_else(|| format!("sentinel {sentinel_port} does not know {name}"))?;
    format!("{ip}:{port}")
        .parse()
        .map_err(|e| format!("sentinel {sentinel_port}: address {ip}:{port}: {e}"))
}
