//! Redis Cluster: masters and replicas joined with `redis-cli --cluster create`, nodes killed and
//! restarted, slots resharded live; and the hash slot of a key.

use super::*;

// ---------------------------------------------------------------------------------------------
// Hash slots
// ---------------------------------------------------------------------------------------------

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key without one,
/// modulo 16384 — what `CLUSTER KEYSLOT` answers.
pub fn key_slot(key: &str) -> u16 {
    let hashed = baton::redis::hash_tag(key).unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed.as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------------------------

/// What a cluster node is, as the cluster sees it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serves hash slots.
    Master,
    /// Replicates a master.
    Replica,
}

/// One node of a [`RedisCluster`], as the cluster describes it (`CLUSTER NODES`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// The client port (the cluster bus is on `port + 10000`).
    pub port: u16,
    /// The node id.
    pub id: String,
    /// The process id while it runs; `None` once killed.
    pub pid: Option<u32>,
    /// Master or replica.
    pub role: Role,
    /// For a replica, the id of its master.
    pub master_id: Option<String>,
    /// The hash slots a master serves, as inclusive ranges in ascending order.
    pub slots: Vec<RangeInclusive<u16>>,
    /// Whether the cluster flags the node as failing (`fail` or `fail?`).
    pub failed: bool,
}

impl ClusterNode {
    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        url(self.port)
    }

    /// Whether this node serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|r| r.contains(&slot))
    }

    /// How many slots this node serves.
    pub fn slot_count(&self) -> usize {
        self.slots.iter().map(|r| r.len()).sum()
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct NodeLine {
    node: ClusterNode,
    myself: bool,
    /// Slots this node has open for migration or import (`[slot->-id]`, `[slot-<-id]`).
    open_slots: Vec<String>,
}

fn parse_cluster_nodes(text: &str) -> Result<Vec<NodeLine>, String> {
    let mut nodes = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("unexpected CLUSTER NODES line: {line:?}");
        if fields.len() < 8 {
            return Err(bad());
        }
        // ip:port@cport[,hostname]
        let port = fields[1]
            .split('@')
            .next()
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(bad)?;
        let flags: Vec<&str> = fields[2].split(',').collect();
        let mut slots = Vec::new();
        let mut open_slots = Vec::new();
        for s in &fields[8..] {
            if s.starts_with('[') {
                open_slots.push((*s).to_owned());
                continue;
            }
            let range = match s.split_once('-') {
                Some((a, b)) => a.parse().ok().zip(b.parse().ok()).map(|(a, b)| a..=b),
                None => s.parse().ok().map(|a| a..=a),
            };
            slots.push(range.ok_or_else(bad)?);
        }
        slots.sort_by_key(|r| *r.start());
        nodes.push(NodeLine {
            node: ClusterNode {
                port,
                id: fields[0].to_owned(),
                pid: None,
                role: if flags.contains(&"master") {
                    Role::Master
                } else {
                    Role::Replica
                },
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
                failed: flags.iter().any(|f| *f == "fail" || *f == "fail?"),
            },
            myself: flags.contains(&"myself"),
            open_slots,
        });
    }
    Ok(nodes)
}

/// `CLUSTER NODES` as the node on `port` sees the cluster.
async fn cluster_nodes(port: u16) -> Result<Vec<NodeLine>, String> {
    let text: String = query(port, redis::cmd("CLUSTER").arg("NODES")).await?;
    parse_cluster_nodes(&text).map_err(|e| format!("127.0.0.1:{port}: {e}"))
}

/// The slot map in a node's view: `(first, last, owner port)`, ascending, failed owners included.
fn slot_map(nodes: &[NodeLine]) -> Vec<(u16, u16, u16)> {
    let mut map: Vec<(u16, u16, u16)> = nodes
        .iter()
        .filter(|n| n.node.role == Role::Master)
        .flat_map(|n| {
            n.node
                .slots
                .iter()
                .map(|r| (*r.start(), *r.end(), n.node.port))
        })
        .collect();
    map.sort_unstable();
    map
}

/// One node in one node's view of the cluster, with its master named by port: views of
/// different nodes compare equal once they agree.
#[derive(Debug, PartialEq, Eq)]
struct NodeView {
    port: u16,
    role: Role,
    master_port: Option<u16>,
    slots: Vec<RangeInclusive<u16>>,
    failed: bool,
}

fn node_views(nodes: &[NodeLine]) -> Vec<NodeView> {
    let port_of = |id: &str| nodes.iter().find(|n| n.node.id == id).map(|n| n.node.port);
    let mut views: Vec<NodeView> = nodes
        .iter()
        .map(|n| NodeView {
            port: n.node.port,
            role: n.node.role,
            master_port: n.node.master_id.as_deref().and_then(port_of),
            slots: n.node.slots.clone(),
            failed: n.node.failed,
        })
        .collect();
    views.sort_by_key(|v| v.port);
    views
}

/// A local Redis Cluster: `masters` masters with `replicas_per_master` replicas each, all on
/// 127.0.0.1, without persistence. Every process is killed by pid on drop.
pub struct RedisCluster {
    // Declared before the temp dir: processes are killed before their directories go.
    nodes: Vec<Process>,
    dir: tempfile::TempDir,
    /// Set for a cluster that is never dropped (see [`RedisCluster::start_watched`]).
    watchdog: Option<Watchdog>,
}

impl RedisCluster {
    /// Starts the nodes, joins them with `redis-cli --cluster create`, and waits until every node
    /// reports `cluster_state:ok`, knows every other node, agrees on the slot map, and every
    /// replica's link to its master is up. `masters` must be at least 3 (Redis's minimum).
    pub async fn start(masters: usize, replicas_per_master: usize) -> Self {
        Self::launch(masters, replicas_per_master, false).await
    }

    /// Like [`RedisCluster::start`], for a cluster kept in a `static` and so never dropped: a
    /// [`Watchdog`] kills every node and removes the cluster's directory once the test process
    /// is gone, however it ends.
    pub async fn start_watched(masters: usize, replicas_per_master: usize) -> Self {
        Self::launch(masters, replicas_per_master, true).await
    }

    async fn launch(masters: usize, replicas_per_master: usize, watched: bool) -> Self {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let dir = tempfile::Builder::new()
            .prefix("baton-cluster-")
            .tempdir()
            .expect("creating a temp dir for the cluster");
        let watchdog = watched.then(|| Watchdog::spawn(dir.path()));
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas_per_master) {
            let node = start_process(dir.path(), "node", free_cluster_port, |port, dir| {
                let mut args = base_args(port, dir);
                args.extend(
                    ["--cluster-enabled", "yes", "--cluster-config-file"].map(OsString::from),
                );
                args.push(dir.join("nodes.conf").into());
                args.push("--cluster-node-timeout".into());
                args.push(CLUSTER_NODE_TIMEOUT.as_millis().to_string().into());
                args
            })
            .await;
            if let (Some(watchdog), Some(pid)) = (&watchdog, node.pid()) {
                watchdog.watch(pid);
            }
            nodes.push(node);
        }
        let cluster = Self {
            nodes,
            dir,
            watchdog,
        };
        cluster.create(replicas_per_master).await;
        if let Err(last) = cluster.health(CLUSTER_READY_TIMEOUT).await {
            panic!(
                "the cluster did not become healthy within {CLUSTER_READY_TIMEOUT:?}: {last}\n{}",
                cluster.logs()
            );
        }
        cluster
    }

    /// `redis-cli --cluster create` over every node.
    async fn create(&self, replicas_per_master: usize) {
        let out_path = self.dir.path().join("cluster-create.log");
        let out = std::fs::File::create(&out_path).expect("creating the redis-cli log");
        let mut command = Command::new("redis-cli");
        command.args(["--cluster", "create"]);
        command.args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        command.args(["--cluster-replicas", &replicas_per_master.to_string()]);
        command.arg("--cluster-yes");
        let mut child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("cloning a file handle"))
            .stderr(out)
            .spawn()
            .expect("spawning redis-cli (is it installed?)");
        let deadline = Instant::now() + CLUSTER_CREATE_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for redis-cli") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-cli --cluster create did not finish within {CLUSTER_CREATE_TIMEOUT:?}:\n{}\n{}",
                    read_to_string(&out_path),
                    self.logs()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        };
        assert!(
            status.success(),
            "redis-cli --cluster create failed ({status}):\n{}\n{}",
            read_to_string(&out_path),
            self.logs()
        );
    }

    /// Waits (at most `limit`) until every running node reports `cluster_state:ok`, knows every
    /// node started, agrees with the others on the slot map (all 16384 slots served), and every
    /// running replica's link to its master is up. For after [`RedisCluster::kill`] or
    /// [`RedisCluster::restart`]; panics with the nodes' logs otherwise.
    pub async fn wait_healthy(&self, limit: Duration) {
        if let Err(last) = self.health(limit).await {
            panic!(
                "the cluster did not become healthy within {limit:?}: {last}\n{}",
                self.logs()
            );
        }
    }

    async fn health(&self, limit: Duration) -> Result<(), String> {
        let total = self.nodes.len();
        let ports: Vec<u16> = self.running_ports();
        poll(limit, || {
            let ports = ports.clone();
            async move {
                let mut first: Option<(u16, Vec<NodeView>)> = None;
                for &port in &ports {
                    let info: String = query(port, redis::cmd("CLUSTER").arg("INFO")).await?;
                    let state = info_field(&info, "cluster_state").unwrap_or("?");
                    if state != "ok" {
                        return Err(format!("127.0.0.1:{port}: cluster_state:{state}"));
                    }
                    let nodes = cluster_nodes(port).await?;
                    if nodes.len() != total {
                        return Err(format!(
                            "127.0.0.1:{port} knows {} of {total} nodes",
                            nodes.len()
                        ));
                    }
                    let covered: usize = slot_map(&nodes)
                        .iter()
                        .map(|(a, b, _)| usize::from(b - a) + 1)
                        .sum();
                    if covered != usize::from(SLOTS) {
                        return Err(format!("127.0.0.1:{port} sees {covered} slots served"));
                    }
                    let view = node_views(&nodes);
                    if let Some(v) = view.iter().find(|v| v.failed == ports.contains(&v.port)) {
                        return Err(format!("127.0.0.1:{port} sees {v:?}"));
                    }
                    match &first {
                        Some((other, seen)) if *seen != view => {
                            return Err(format!(
                                "127.0.0.1:{port} and 127.0.0.1:{other} disagree: {view:?} vs \
                                 {seen:?}"
                            ));
                        }
                        Some(_) => {}
                        None => first = Some((port, view)),
                    }
                    let me = nodes.iter().find(|n| n.myself).ok_or("no myself line")?;
                    if me.node.role == Role::Replica {
                        let repl: String =
                            query(port, redis::cmd("INFO").arg("replication")).await?;
                        let link = info_field(&repl, "master_link_status").unwrap_or("?");
                        if link != "up" {
                            return Err(format!("replica 127.0.0.1:{port}: master link {link}"));
                        }
                    }
                }
                Ok(())
            }
        })
        .await
    }

    fn running_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.running())
            .map(|n| n.port)
            .collect()
    }

    fn process(&self, port: u16) -> &Process {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    fn process_mut(&mut self, port: u16) -> &mut Process {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// `redis://127.0.0.1:PORT` of every node started (killed ones included: clients skip seeds
    /// that do not answer).
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| url(n.port)).collect()
    }

    /// The client ports of every node started.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Every node as the cluster sees it now (asking the first running node that answers),
    /// with the pids of the ones still running.
    pub async fn nodes(&self) -> Vec<ClusterNode> {
        let mut errors = Vec::new();
        for port in self.running_ports() {
            match cluster_nodes(port).await {
                Ok(lines) => {
                    let mut nodes: Vec<ClusterNode> = lines
                        .into_iter()
                        .map(|l| {
                            let mut node = l.node;
                            node.pid = self
                                .nodes
                                .iter()
                                .find(|p| p.port == node.port)
                                .and_then(Process::pid);
                            node
                        })
                        .collect();
                    nodes.sort_by_key(|n| n.port);
                    return nodes;
                }
                Err(e) => errors.push(e),
            }
        }
        panic!("no cluster node answered CLUSTER NODES: {errors:?}");
    }

    /// The masters not flagged as failing, in port order.
    pub async fn masters(&self) -> Vec<ClusterNode> {
        self.nodes()
            .await
            .into_iter()
            .filter(|n| n.role == Role::Master && !n.failed)
            .collect()
    }

    /// The master serving `slot`.
    pub async fn node_for_slot(&self, slot: u16) -> ClusterNode {
        let masters = self.masters().await;
        masters
            .iter()
            .find(|n| n.serves(slot))
            .cloned()
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {masters:?}"))
    }

    /// The master serving `key` (its slot from [`key_slot`]).
    pub async fn node_for_key(&self, key: &str) -> ClusterNode {
        self.node_for_slot(key_slot(key)).await
    }

    /// The process id of the node on `port`, while it runs.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.process(port).pid()
    }

    /// Sets `parameter` to `value` (`CONFIG SET`) on every running node, e.g.
    /// `cluster-require-full-coverage no` so that the masters keep serving their own slots while
    /// another master is down.
    pub async fn config_set(&self, parameter: &str, value: &str) {
        for port in self.running_ports() {
            let _: () = query(
                port,
                redis::cmd("CONFIG").arg("SET").arg(parameter).arg(value),
            )
            .await
            .unwrap_or_else(|e| panic!("CONFIG SET {parameter} {value}: {e}"));
        }
    }

    /// Kills the node on `port` (SIGKILL, as a crash would).
    pub fn kill(&mut self, port: u16) {
        self.process_mut(port).kill();
    }

    /// Starts a killed node again on its port with its `nodes.conf`, so it rejoins the cluster
    /// under its old id (with no data: nothing is saved). Returns once it answers; use
    /// [`RedisCluster::wait_healthy`] to wait for the cluster to take it back.
    pub async fn restart(&mut self, port: u16) {
        let process = self.process_mut(port);
        let args = process.args.clone();
        process.relaunch(args).await;
        let pid = process.pid();
        if let (Some(watchdog), Some(pid)) = (&self.watchdog, pid) {
            watchdog.watch(pid);
        }
    }

    /// Kills every node (SIGKILL, as a crash of the whole cluster would).
    pub fn kill_all(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }

    /// Starts every killed node again (see [`RedisCluster::restart`]) and waits until the
    /// cluster is healthy again (see [`RedisCluster::wait_healthy`]); the data is gone.
    pub async fn restart_killed(&mut self) {
        let killed: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| !n.running())
            .map(|n| n.port)
            .collect();
        for port in killed {
            self.restart(port).await;
        }
        self.wait_healthy(CLUSTER_READY_TIMEOUT).await;
    }

    /// The process ids of the running nodes.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(Process::pid).collect()
    }

    /// A multiplexed connection to the node on `port` alone (no redirections followed), for a
    /// test's assertions: its replies may take 30 s.
    pub async fn node_client(&self, port: u16) -> MultiplexedConnection {
        connect_for(port, ASSERTION_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("node client: {e}"))
    }

    /// A cluster client builder with every node as a seed, for clients with options (RESP3 and
    /// a push sender for pub/sub, timeouts).
    pub fn client_builder(&self) -> ClusterClientBuilder {
        ClusterClient::builder(self.seed_urls())
    }

    /// A redis-rs cluster connection (follows MOVED and ASK), for tests' own assertions.
    pub async fn client(&self) -> ClusterConnection {
        let client = self.client_builder().build().expect("cluster client");
        within(
            Duration::from_secs(5),
            client.get_async_connection(),
            "a cluster connection",
        )
        .await
        .expect("connecting to the cluster")
    }

    /// Moves `slot` and the keys in it to the master on `to_port` by a live resharding (see
    /// [`RedisCluster::begin_migration`]), [`MIGRATE_BATCH`] keys at a time; returns how many
    /// keys moved. Clients keep working meanwhile, redirected by ASK and then MOVED.
    pub async fn migrate_slot(&self, slot: u16, to_port: u16) -> usize {
        let mut migration = self.begin_migration(slot, to_port).await;
        while migration.move_keys(MIGRATE_BATCH).await > 0 {}
        migration.finish().await
    }

    /// Opens the migration of `slot` to the master on `to_port`: `CLUSTER SETSLOT IMPORTING` on
    /// the target, then `MIGRATING` on the current owner. From then on the owner answers ASK for
    /// keys it no longer has, so a test can act in the middle of a resharding.
    pub async fn begin_migration(&self, slot: u16, to_port: u16) -> SlotMigration<'_> {
        assert!(slot < SLOTS, "slot {slot} is out of range");
        let from = self.node_for_slot(slot).await;
        let masters = self.masters().await;
        let to = masters
            .iter()
            .find(|n| n.port == to_port)
            .cloned()
            .unwrap_or_else(|| panic!("no running master on port {to_port}: {masters:?}"));
        assert_ne!(from.port, to.port, "slot {slot} is already on {to_port}");
        let from_conn = self.node_client(from.port).await;
        let to_conn = self.node_client(to.port).await;
        let mut migration = SlotMigration {
            cluster: self,
            slot,
            from,
            to,
            from_conn,
            to_conn,
            moved: 0,
        };
        let (slot, from_id, to_id) = (
            migration.slot,
            migration.from.id.clone(),
            migration.to.id.clone(),
        );
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&from_id)
            .query_async(&mut migration.to_conn)
            .await
            .expect("CLUSTER SETSLOT IMPORTING on the target");
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&to_id)
            .query_async(&mut migration.from_conn)
            .await
            .expect("CLUSTER SETSLOT MIGRATING on the source");
        migration
    }

    /// Everything the nodes logged, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node 127.0.0.1:{} ---\n{}", n.port, n.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for n in &self.nodes {
                eprintln!(
                    "--- cluster node 127.0.0.1:{} (last lines) ---\n{}",
                    n.port,
                    n.log_tail(15)
                );
            }
        }
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// A resharding of one slot in progress (see [`RedisCluster::begin_migration`]). Dropping it
/// without [`SlotMigration::finish`] leaves the slot half-migrated.
pub struct SlotMigration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    from: ClusterNode,
    to: ClusterNode,
    from_conn: MultiplexedConnection,
    to_conn: MultiplexedConnection,
    moved: usize,
}

impl SlotMigration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The master the slot is leaving.
    pub fn source(&self) -> &ClusterNode {
        &self.from
    }

    /// The master the slot is moving to.
    pub fn target(&self) -> &ClusterNode {
        &self.to
    }

    /// Moves up to `max` of the keys still on the source with one `MIGRATE`; returns how many
    /// keys it handed to `MIGRATE` (some may have been deleted or expired meanwhile), 0 once the
    /// source holds none of the slot's keys.
    pub async fn move_keys(&mut self, max: usize) -> usize {
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(max)
            .query_async(&mut self.from_conn)
            .await
            .expect("CLUSTER GETKEYSINSLOT");
        if keys.is_empty() {
            return 0;
        }
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.to.port)
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut self.from_conn)
            .await
            .unwrap_or_else(|e| {
                panic!("MIGRATE of {} keys in slot {}: {e}", keys.len(), self.slot)
            });
        // NOKEY: every key of the batch was deleted or expired since GETKEYSINSLOT.
        assert!(reply == "OK" || reply == "NOKEY", "MIGRATE replied {reply}");
        self.moved += keys.len();
        keys.len()
    }

    /// Moves the keys still on the source whose name `moves` accepts, with one `MIGRATE`;
    /// returns how many it handed to `MIGRATE`.
    pub async fn move_keys_where(&mut self, moves: impl Fn(&str) -> bool) -> usize {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(100_000)
            .query_async(&mut self.from_conn)
            .await
            .expect("CLUSTER GETKEYSINSLOT");
        let keys: Vec<String> = keys.into_iter().filter(|k| moves(k)).collect();
        if keys.is_empty() {
            return 0;
        }
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.to.port)
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut self.from_conn)
            .await
            .unwrap_or_else(|e| {
                panic!("MIGRATE of {} keys in slot {}: {e}", keys.len(), self.slot)
            });
        assert!(reply == "OK" || reply == "NOKEY", "MIGRATE replied {reply}");
        self.moved += keys.len();
        keys.len()
    }

    /// Moves the remaining keys, assigns the slot to the target (`CLUSTER SETSLOT NODE` on the
    /// target, the source, then every other master), and waits until every running node agrees
    /// that the target serves it. Returns how many keys this migration moved in all.
    pub async fn finish(mut self) -> usize {
        while self.move_keys(MIGRATE_BATCH).await > 0 {}
        let masters = self.cluster.masters().await;
        let mut order = vec![self.to.port, self.from.port];
        order.extend(
            masters
                .iter()
                .map(|m| m.port)
                .filter(|p| *p != self.to.port && *p != self.from.port),
        );
        for port in order {
            let _: () = query(
                port,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(self.slot)
                    .arg("NODE")
                    .arg(&self.to.id),
            )
            .await
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {} NODE: {e}", self.slot));
        }
        let (slot, target) = (self.slot, self.to.port);
        let agreed = poll(SLOT_AGREEMENT_TIMEOUT, || {
            let ports = self.cluster.running_ports();
            async move {
                for port in ports {
                    let nodes = cluster_nodes(port).await?;
                    let owner = slot_map(&nodes)
                        .into_iter()
                        .find(|(a, b, _)| (*a..=*b).contains(&slot))
                        .map(|(_, _, owner)| owner);
                    if owner != Some(target) {
                        return Err(format!("127.0.0.1:{port} says slot {slot} is on {owner:?}"));
                    }
                    if let Some(open) = nodes.iter().find(|n| !n.open_slots.is_empty()) {
                        return Err(format!(
                            "127.0.0.1:{port} sees open slots {:?} on {}",
                            open.open_slots, open.node.port
                        ));
                    }
                }
                Ok(())
            }
        })
        .await;
        if let Err(last) = agreed {
            panic!(
                "the nodes did not agree on slot {slot} moving to {target} within \
                 {SLOT_AGREEMENT_TIMEOUT:?}: {last}"
            );
        }
        self.moved
    }
}
