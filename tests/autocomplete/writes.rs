//! Large writes, retries and the Cluster.

use super::*;

/// A xorshift64* generator of pseudo-random numbers, the same for the same `seed`.
fn random(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Display texts of the most work one term can ask of Redis: 256 bytes of words of fresh
/// letters, so that nearly every 2- and 3-letter gram of every word is new (each is a set Baton
/// writes to), the same for the same `seed`.
fn heaviest_displays(n: usize, seed: u64) -> Vec<String> {
    let mut next = random(seed);
    (0..n)
        .map(|i| {
            let mut s = format!("{i:04}");
            while s.len() < 256 {
                // Words of 1 to 60 letters; long ones have the most grams.
                let len = 1 + (next() % 60) as usize;
                s.push(' ');
                for _ in 0..len {
                    if s.len() == 256 {
                        break;
                    }
                    s.push(char::from(b'a' + (next() % 26) as u8));
                }
            }
            s.truncate(256);
            s.trim_end().to_owned()
        })
        .collect()
}

/// The durations of the script calls SLOWLOG logged since it was reset (every node), longest
/// first.
async fn slow_scripts(conn: &mut support::RedisConn) -> Vec<Duration> {
    let logs: Vec<Vec<redis::Value>> = conn
        .on_every_node(redis::cmd("SLOWLOG").arg("GET").arg(-1))
        .await;
    let mut durations = Vec::new();
    for entry in logs.into_iter().flatten() {
        let redis::Value::Array(fields) = entry else {
            panic!("a SLOWLOG entry: {entry:?}");
        };
        let micros: u64 = redis::from_redis_value_ref(&fields[2]).expect("a duration");
        let args: Vec<Vec<u8>> = redis::from_redis_value_ref(&fields[3]).expect("arguments");
        let command = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        if command == "evalsha" || command == "eval" {
            durations.push(Duration::from_micros(micros));
        }
    }
    durations.sort_unstable_by(|a, b| b.cmp(a));
    durations
}

/// Script calls every node ran since the last `CONFIG RESETSTAT`, and their total duration
/// (`INFO commandstats`).
async fn script_stats(conn: &mut support::RedisConn) -> (u64, Duration) {
    let stats: Vec<String> = conn
        .on_every_node(redis::cmd("INFO").arg("commandstats"))
        .await;
    let (mut calls, mut micros) = (0, 0);
    for line in stats.iter().flat_map(|s| s.lines()) {
        let Some(fields) = line.strip_prefix("cmdstat_evalsha:") else {
            continue;
        };
        let field = |name: &str| -> u64 {
            fields
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .map_or(0, |n| n.trim().parse().expect("a number"))
        };
        calls += field("calls");
        micros += field("usec");
    }
    (calls, Duration::from_micros(micros))
}

/// A 1000-term Add of the largest terms Baton takes (256 bytes of fresh words each, 1 KiB
/// payloads, score increments) answers OK and counts each increment once, in script calls that
/// each hold Redis a short while: on average less than an eighth of the command timeout, and
/// each less than a quarter of it, but for at most one in a hundred (a busy machine may stall
/// the odd call on its way).
#[tokio::test]
async fn largest_add_runs_in_short_script_calls() {
    // Reads and resets node-wide logs and counters.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let mut conn = redis.conn().await;
    let timeout = baton::config::DEFAULT_REDIS_COMMAND_TIMEOUT;
    // Script calls of more than a tenth of the timeout are logged (logging every call would
    // make a reply too large to read in time).
    let logged = (timeout / 10).as_micros().to_string();
    for (name, value) in [
        ("slowlog-log-slower-than", logged.as_str()),
        ("slowlog-max-len", "10000"),
    ] {
        let _: Vec<()> = conn
            .on_every_node(redis::cmd("CONFIG").arg("SET").arg(name).arg(value))
            .await;
    }
    let displays = heaviest_displays(1000, 12);
    let terms: Vec<pb::AutocompleteTerm> = displays
        .iter()
        .map(|d| pb::AutocompleteTerm {
            display: d.clone(),
            score: Some(1.0),
            increment: true,
            payload: Some(vec![b'p'; 1024]),
        })
        .collect();
    let _: Vec<()> = conn.on_every_node(redis::cmd("SLOWLOG").arg("RESET")).await;
    conn.reset_stats().await;
    let started = std::time::Instant::now();
    let added = within(
        Duration::from_secs(300),
        client.add(pb::AutocompleteServiceAddRequest {
            dictionary: "heavy".into(),
            terms,
            ..Default::default()
        }),
        "the Add",
    )
    .await
    .unwrap_or_else(|s| panic!("the largest Add failed: {s:?}"))
    .into_inner();
    let took = started.elapsed();
    let slow = slow_scripts(&mut conn).await;
    let (calls, total) = script_stats(&mut conn).await;
    let average = total / u32::try_from(calls.max(1)).expect("calls fit");
    eprintln!(
        "1000 largest terms: {took:?} in all; {calls} script calls, {total:?} of Redis time, \
         {average:?} on average; the longest {:?}",
        &slow[..slow.len().min(5)]
    );
    assert_eq!(added.added, 1000);
    assert_eq!(added.term_count, 1000);
    assert!(added.scores.iter().all(|s| *s == 1.0), "{:?}", added.scores);
    let heaviest = baton::autocomplete::heaviest_step();
    assert!(
        heaviest <= baton::autocomplete::MAX_STEP_WORK as u64,
        "a write step did {heaviest} units of work"
    );
    assert!(
        average < timeout / 8,
        "script calls took {average:?} on average, more than {:?}",
        timeout / 8
    );
    let long = slow.iter().filter(|d| **d >= timeout / 4).count();
    assert!(
        long as u64 <= calls / 100,
        "{long} of {calls} script calls held Redis for more than {:?}: {slow:?}",
        timeout / 4
    );
    // Everything is there: each term by its last word, with its score counted once.
    for d in displays.iter().step_by(97) {
        let last = d.rsplit(' ').next().expect("a word");
        let got = all_pages(
            &mut client,
            request("heavy", last, Mode::WordPrefix, Order::Lexicographic, 100),
        )
        .await;
        let hit = got
            .iter()
            .find(|s| &s.display == d)
            .unwrap_or_else(|| panic!("{d:?} is not found by {last:?}"));
        assert_eq!(hit.score, 1.0);
        assert_eq!(hit.payload.len(), 1024);
    }
}

/// No write step does more work than its budget, whatever the batch: the largest ones (1000
/// terms, payloads, increments) into one prefix, across the creation of its ranked and deep sets
/// and the dictionary's, through many cut-backs of the deep set and of `top`, then `Remove`s of
/// nearly every term (dropping those sets) and a change of features. Each write script reports
/// the work it did (members and fields read or written, copies and cut-backs included), which is
/// deterministic; the longest script calls by `SLOWLOG` are printed, and checked only against a
/// margin a busy machine keeps.
#[tokio::test]
async fn write_steps_stay_within_their_work_budget() {
    use baton::autocomplete::{
        CUT_RESERVE, MAX_STEP_WORK, STEP_WORK, heaviest_shared_step, heaviest_step,
    };
    // Reads and resets node-wide logs.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let mut conn = redis.conn().await;
    for (name, value) in [
        ("slowlog-log-slower-than", "5000"),
        ("slowlog-max-len", "10000"),
    ] {
        let _: Vec<()> = conn
            .on_every_node(redis::cmd("CONFIG").arg("SET").arg(name).arg(value))
            .await;
    }
    let _: Vec<()> = conn.on_every_node(redis::cmd("SLOWLOG").arg("RESET")).await;
    conn.reset_stats().await;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    // 9000 terms of one prefix "abc", with fresh words up to 256 bytes, in batches of 1000:
    // the dictionary, "ab" and "abc" pass 256 terms within the first batch, and random scores
    // keep terms joining the deep set of "abc" and top past twice their size.
    let mut displays = Vec::new();
    for batch in 0..9 {
        let terms: Vec<pb::AutocompleteTerm> = (0..1000)
            .map(|i| {
                let mut d = format!("abc{batch}{i:03}");
                let len = if i % 50 == 0 { 256 } else { 40 };
                while d.len() < len {
                    d.push(' ');
                    for _ in 0..(1 + next() % 12) {
                        d.push(char::from(b'a' + (next() % 26) as u8));
                    }
                }
                d.truncate(len);
                let d = d.trim_end().to_owned();
                displays.push(d.clone());
                pb::AutocompleteTerm {
                    display: d,
                    score: Some((next() % 1_000_000) as f64),
                    increment: i % 3 == 0,
                    payload: Some(vec![b'p'; 1024]),
                }
            })
            .collect();
        within(
            Duration::from_secs(120),
            client.add(pb::AutocompleteServiceAddRequest {
                dictionary: "budget".into(),
                terms,
                ..Default::default()
            }),
            "an Add",
        )
        .await
        .unwrap_or_else(|s| panic!("Add failed: {s:?}"));
    }
    assert_eq!(count(&mut client, "budget").await, 9000);
    let mut key_kinds = HashSet::new();
    let keys: Vec<String> = conn
        .on_every_node::<Vec<String>>(redis::cmd("KEYS").arg("*budget*"))
        .await
        .into_iter()
        .flatten()
        .collect();
    for k in &keys {
        key_kinds.extend(
            ["r:ab", "t:abc", ":top", ":b:61"]
                .into_iter()
                .filter(|p| k.ends_with(p)),
        );
    }
    assert_eq!(
        key_kinds.len(),
        4,
        "the ranked sets were not all made: {keys:?}"
    );
    let after_adds = heaviest_step();
    // Nearly every term goes, 1000 at a time: the deep set, the prefix's and the first-byte sets
    // and top are dropped on the way.
    for chunk in displays[..8900].chunks(1000) {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        remove(&mut client, "budget", &chunk).await;
    }
    assert_eq!(count(&mut client, "budget").await, 100);
    configure(&mut client, "budget", &[Feature::Ranked])
        .await
        .expect("Configure");
    until_changed(&mut client, "budget").await;
    let (heaviest, shared) = (heaviest_step(), heaviest_shared_step());
    let slow = slow_scripts(&mut conn).await;
    let (calls, total) = script_stats(&mut conn).await;
    eprintln!(
        "heaviest write step: {after_adds} units after the Adds, {heaviest} in all, {shared} of \
         several entries (budget {STEP_WORK}, at most {MAX_STEP_WORK}); {calls} script calls, \
         {total:?} of Redis time; the longest {:?}",
        &slow[..slow.len().min(5)]
    );
    // (Steps of every test of this process count: all are bound alike.)
    assert!(
        heaviest <= MAX_STEP_WORK as u64,
        "a write step did {heaviest} units of work, more than {MAX_STEP_WORK}"
    );
    assert!(
        shared <= (STEP_WORK + CUT_RESERVE) as u64,
        "a write step of several entries did {shared} units of work, more than {}",
        STEP_WORK + CUT_RESERVE
    );
    assert!(
        after_adds >= STEP_WORK as u64 / 2,
        "the Adds never came near the budget ({after_adds}): the test lost its point"
    );
    let timeout = baton::config::DEFAULT_REDIS_COMMAND_TIMEOUT;
    let long = slow.iter().filter(|d| **d >= timeout / 4).count();
    assert!(
        long as u64 <= calls / 100,
        "{long} of {calls} script calls held Redis for more than {:?}: {slow:?}",
        timeout / 4
    );
}

/// `n` display texts of 4 words of 6 to 13 random letters and digits, the same for the same
/// `seed`: nearly every word is new to the vocabulary, so that its grams are written.
fn fresh_word_displays(n: usize, seed: u64) -> Vec<String> {
    const SYMBOLS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut next = random(seed);
    (0..n)
        .map(|_| {
            let words: Vec<String> = (0..4)
                .map(|_| {
                    (0..6 + next() % 8)
                        .map(|_| char::from(SYMBOLS[(next() % 36) as usize]))
                        .collect()
                })
                .collect();
            words.join(" ")
        })
        .collect()
}

/// `n` display texts of 36 words of 2 random ideographs (251 bytes), the same for the same
/// `seed`: every word is new to the vocabulary, and has 3 grams.
fn fresh_ideograph_displays(n: usize, seed: u64) -> Vec<String> {
    let mut next = random(seed);
    (0..n)
        .map(|_| {
            let words: Vec<String> = (0..36)
                .map(|_| {
                    (0..2)
                        .map(|_| char::from_u32(0x4E00 + (next() % 0x5000) as u32).unwrap())
                        .collect()
                })
                .collect();
            words.join(" ")
        })
        .collect()
}

/// Adds `displays` to `dictionary` (score 1) in batches of `batch`.
async fn add_displays(client: &mut Client, dictionary: &str, displays: &[String], batch: usize) {
    for chunk in displays.chunks(batch) {
        let request = pb::AutocompleteServiceAddRequest {
            dictionary: dictionary.into(),
            terms: chunk
                .iter()
                .map(|d| pb::AutocompleteTerm {
                    display: d.clone(),
                    score: Some(1.0),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        within(Duration::from_secs(120), client.add(request), "an Add")
            .await
            .unwrap_or_else(|s| panic!("Add to {dictionary:?} failed: {s:?}"));
    }
}

/// Redis time a script call since the last reset of its counters.
async fn time_a_call(conn: &mut support::RedisConn) -> Duration {
    let (calls, total) = script_stats(conn).await;
    assert!(calls > 0, "no script call was counted");
    total / u32::try_from(calls).expect("calls fit")
}

/// Writes of terms whose words are all new hold Redis about as briefly a step as any other: each
/// such word's posting and grams are written (a command on a set of its own each, most of them
/// created), steps are planned and counted for that (`GRAM_WORK`), and paced by the Redis time
/// they take (`STEP_TIME`). An `Add`, a `Remove`, a SUBSTRING build and a WORDS build over terms
/// of 4 random words, and an `Add` of terms of 36 random two-ideograph words to a dictionary with
/// WORDS and without SUBSTRING, take at most 4 times the Redis time a script call of an `Add` to
/// a dictionary without features (whose steps are of 64 entries) in the same run. On this
/// project's 2-core machine, with grams planned as cheaply as other members and no pacing, the
/// `Add`, the `Remove`, the SUBSTRING build and the `Add` of ideographs took 6.5, 5.2, 7.4 and 4.1
/// times (the WORDS build 1.2 times: its few long steps do not show in its average).
#[tokio::test]
async fn steps_of_fresh_words_hold_redis_as_briefly_as_others() {
    // Reads and resets node-wide counters.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let mut conn = redis.conn().await;
    let n = 4000;
    let add_all = |client: &mut Client, dictionary: &'static str, seed: u64| {
        let mut client = client.clone();
        async move {
            let displays = fresh_word_displays(n, seed);
            add_displays(&mut client, dictionary, &displays, 1000).await;
            displays
        }
    };

    configure(&mut client, "plain", &[])
        .await
        .expect("Configure");
    conn.reset_stats().await;
    add_all(&mut client, "plain", 1).await;
    let plain = time_a_call(&mut conn).await;

    conn.reset_stats().await;
    let displays = add_all(&mut client, "fresh", 2).await;
    let add = time_a_call(&mut conn).await;
    conn.reset_stats().await;
    for chunk in displays.chunks(1000) {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        remove(&mut client, "fresh", &chunk).await;
    }
    let removed = time_a_call(&mut conn).await;
    assert_eq!(count(&mut client, "fresh").await, 0);

    configure(&mut client, "built", &[Feature::Ranked, Feature::Words])
        .await
        .expect("Configure");
    add_all(&mut client, "built", 3).await;
    conn.reset_stats().await;
    configure(
        &mut client,
        "built",
        &[Feature::Ranked, Feature::Words, Feature::Substring],
    )
    .await
    .expect("Configure");
    until_changed(&mut client, "built").await;
    let build = time_a_call(&mut conn).await;

    // Words without their grams: a posting created a word.
    configure(
        &mut client,
        "ideographs",
        &[Feature::Ranked, Feature::Words],
    )
    .await
    .expect("Configure");
    conn.reset_stats().await;
    add_displays(
        &mut client,
        "ideographs",
        &fresh_ideograph_displays(2000, 4),
        500,
    )
    .await;
    let ideographs = time_a_call(&mut conn).await;
    configure(&mut client, "words", &[Feature::Ranked])
        .await
        .expect("Configure");
    add_all(&mut client, "words", 5).await;
    conn.reset_stats().await;
    configure(&mut client, "words", &[Feature::Ranked, Feature::Words])
        .await
        .expect("Configure");
    until_changed(&mut client, "words").await;
    let words_build = time_a_call(&mut conn).await;

    eprintln!(
        "Redis time a script call: Add without features {plain:?}; with every feature, terms of \
         fresh words: Add {add:?}, Remove {removed:?}; SUBSTRING built over them {build:?}; \
         ideographs with WORDS: Add {ideographs:?}; WORDS built over fresh words {words_build:?}"
    );
    for (what, took) in [
        ("Add", add),
        ("Remove", removed),
        ("SUBSTRING build", build),
        ("Add of ideographs", ideographs),
        ("WORDS build", words_build),
    ] {
        assert!(
            took <= plain * 4,
            "a script call of a{} {what} of fresh words held Redis {took:?}, more than 4 times \
             one of an Add without features ({plain:?})",
            if what.starts_with("Add") { "n" } else { "" }
        );
    }
}

/// The `request_id` a failed Add's status names (its `ErrorInfo` detail), if any.
fn request_id_of(status: &Status) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .and_then(|info| info.metadata.get("request_id").cloned())
}

/// Terms in the batches of [`increments`].
const INCREMENTS: usize = 200;

/// A batch of [`INCREMENTS`] score increments (one per term, each term's text long enough for
/// the batch to take many steps), sent to `dictionary`.
fn increments(dictionary: &str) -> pb::AutocompleteServiceAddRequest {
    pb::AutocompleteServiceAddRequest {
        dictionary: dictionary.into(),
        terms: (0..INCREMENTS)
            .map(|i| pb::AutocompleteTerm {
                display: format!(
                    "counter {i:04}{}",
                    &heaviest_displays(1, i as u64)[0][4..100]
                ),
                score: Some(1.0),
                increment: true,
                payload: None,
            })
            .collect(),
        ..Default::default()
    }
}

/// Sends `batch` again (as a retry) with the request id `status` names, and checks that every
/// increment counted once and that the answer is that of one application.
async fn retry_counts_once(
    client: &mut Client,
    status: &Status,
    batch: &pb::AutocompleteServiceAddRequest,
) {
    let id = request_id_of(status).unwrap_or_else(|| panic!("no request id in {status:?}"));
    assert!(
        status.message().contains(&id),
        "the message names the id: {status:?}"
    );
    let answer = client
        .add(pb::AutocompleteServiceAddRequest {
            request_id: id,
            ..batch.clone()
        })
        .await
        .unwrap_or_else(|s| panic!("the retry failed: {s:?}"))
        .into_inner();
    assert!(
        answer.scores.iter().all(|s| *s == 1.0),
        "increments counted more than once: {:?}",
        &answer.scores[..5]
    );
    assert_eq!(answer.added as usize, INCREMENTS, "as if applied once");
    assert_eq!(answer.updated, 0);
    assert_eq!(answer.term_count as usize, INCREMENTS);
    let all = all_pages(
        client,
        request(
            &batch.dictionary,
            "counter",
            Mode::Prefix,
            Order::Score,
            1000,
        ),
    )
    .await;
    assert_eq!(all.len(), INCREMENTS);
    for s in &all {
        assert_eq!(s.score, 1.0, "{} counted more than once", s.display);
    }
}

/// Sends `batch` through a Baton of its own over `redis` (with `deadline` when set, and then a
/// command timeout longer than it), stops Redis (SIGSTOP) as soon as the batch's first step has
/// written, and returns the call's status once it failed, with Redis running again and the
/// number of terms applied by then (or while Redis resumed).
async fn add_stalled_mid_batch(
    redis: &RedisServer,
    prefix: &str,
    batch: &pb::AutocompleteServiceAddRequest,
    deadline: Option<Duration>,
) -> (Status, u64) {
    let baton = Baton::start_with(redis, |c| {
        c.redis.key_prefix = prefix.to_owned();
        if let Some(d) = deadline {
            c.redis.command_timeout = 2 * d;
        }
    })
    .await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    // Redis knows the scripts (a first call loads them), as it does in service.
    let warm_up = pb::AutocompleteServiceAddRequest {
        dictionary: "warm-up".into(),
        terms: batch.terms[..1].to_vec(),
        ..Default::default()
    };
    client.add(warm_up).await.expect("warm-up Add");

    let mut conn = redis.conn().await;
    let _: Vec<()> = conn
        .on_every_node(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("notify-keyspace-events")
                .arg("Kh"),
        )
        .await;
    let data = baton::autocomplete::DictionaryKeys::new(prefix, &batch.dictionary).data;
    let url = match redis.cluster() {
        Some(cluster) => cluster.node_for_key(&data).await.url(),
        None => redis.url(),
    };
    let mut events = redis::Client::open(url)
        .expect("a client")
        .get_async_pubsub()
        .await
        .expect("a subscriber");
    events
        .subscribe(format!("__keyspace@0__:{data}"))
        .await
        .expect("SUBSCRIBE");
    let mut events = events.into_on_message();
    let mut call = tonic::Request::new(batch.clone());
    if let Some(d) = deadline {
        call.set_timeout(d);
    }
    let mut add = tokio::spawn(async move { client.add(call).await });
    tokio::select! {
        event = within(
            Duration::from_secs(30),
            futures::StreamExt::next(&mut events),
            "the first step's write",
        ) => {
            event.expect("an event");
        }
        done = &mut add => panic!("the Add ended before its first step: {done:?}"),
    }
    redis.signal(nix::sys::signal::Signal::SIGSTOP);
    let failed = within(Duration::from_secs(30), add, "the Add to a stopped Redis")
        .await
        .expect("the Add task");
    redis.signal(nix::sys::signal::Signal::SIGCONT);
    let status = failed.expect_err("Redis stopped before the batch's end");
    let reader = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let dictionary = batch.dictionary.clone();
    let applied = support::wait_until(Duration::from_secs(10), "Redis to answer", || {
        let mut reader = reader.clone();
        let dictionary = dictionary.clone();
        async move { try_count(&mut reader, &dictionary).await }
    })
    .await;
    (status, applied)
}

/// The terms of `dictionary` in Redis, or why they could not be counted.
async fn try_count(client: &mut Client, dictionary: &str) -> Result<u64, Status> {
    client
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: dictionary.into(),
        })
        .await
        .map(|d| d.into_inner().term_count)
}

/// An Add of score increments whose step timed out after it reached Redis (Redis stopped
/// mid-batch, then resumed) answers UNAVAILABLE with its first steps applied, naming the request
/// id Baton made up for it; retried with that id through another Baton, each increment counts
/// once and the answer is that of one application.
#[tokio::test]
async fn increment_stalled_mid_batch_counts_once_when_retried() {
    // Stops Redis and sets keyspace events.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let batch = increments("counters");
    let (status, applied) = add_stalled_mid_batch(&redis, baton.prefix(), &batch, None).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        applied > 0 && (applied as usize) < INCREMENTS,
        "{applied} terms applied: the batch stopped midway"
    );
    retry_counts_once(&mut client, &status, &batch).await;
}

/// An Add still running near its caller's deadline (Redis stopped mid-batch) answers
/// UNAVAILABLE before that deadline, naming the request id Baton made up; retried with the id,
/// the rest is applied, each increment once.
#[tokio::test]
async fn add_near_the_callers_deadline_answers_in_time() {
    // Stops Redis and sets keyspace events.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let batch = increments("deadline");
    // Long enough for the first steps on a busy machine; the Baton's command timeout is longer,
    // so the caller's deadline is what ends the call.
    let deadline = Duration::from_secs(2);
    let (status, applied) =
        add_stalled_mid_batch(&redis, baton.prefix(), &batch, Some(deadline)).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("deadline"),
        "stopped by the deadline: {status:?}"
    );
    assert!(
        applied > 0 && (applied as usize) < INCREMENTS,
        "{applied} terms applied: the batch stopped midway"
    );
    retry_counts_once(&mut client, &status, &batch).await;
}

/// A client's request id makes an Add safe to send again: sent twice, one after the other or at
/// the same time, the batch is applied once and every call answers as one application would;
/// the id is scoped to the dictionary, and sent with another batch it is refused.
#[tokio::test]
async fn request_id_applies_a_batch_once() {
    let (_redis, _baton, mut client) = setup().await;
    let batch = |id: &str, n: u32| pb::AutocompleteServiceAddRequest {
        dictionary: "ids".into(),
        terms: (0..n)
            .map(|i| pb::AutocompleteTerm {
                display: format!("t{}", i % 150),
                score: Some(f64::from(i % 7)),
                increment: i % 3 != 0,
                payload: Some(vec![u8::try_from(i % 256).unwrap()]),
            })
            .collect(),
        request_id: id.into(),
    };
    let once = client.add(batch("r1", 400)).await.unwrap().into_inner();
    assert_eq!(once.added, 150);
    assert_eq!(once.updated, 250);
    let again = client.add(batch("r1", 400)).await.unwrap().into_inner();
    assert_eq!(again, once, "the same answer");
    let scores = |answer: &pb::AutocompleteServiceAddResponse| -> HashMap<String, f64> {
        let mut last = HashMap::new();
        for (i, s) in answer.scores.iter().enumerate() {
            last.insert(format!("t{}", i % 150), *s);
        }
        last
    };
    let expected = scores(&once);
    let check = |got: Vec<pb::AutocompleteSuggestion>| {
        assert_eq!(got.len(), 150);
        for s in got {
            assert_eq!(Some(&s.score), expected.get(&s.display), "{}", s.display);
        }
    };
    check(
        all_pages(
            &mut client,
            request("ids", "t", Mode::Prefix, Order::Lexicographic, 1000),
        )
        .await,
    );

    // At the same time, from three clients: one application.
    let mut calls = JoinSet::new();
    for _ in 0..3 {
        let mut c = client.clone();
        let b = batch("r2", 400);
        calls.spawn(async move { c.add(b).await.map(tonic::Response::into_inner) });
    }
    let mut answers = Vec::new();
    while let Some(done) = within(Duration::from_secs(30), calls.join_next(), "the calls").await {
        answers.push(done.expect("no panic").expect("Add"));
    }
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    assert_eq!(answers[0].updated, 400, "every term was there");
    let doubled: HashMap<String, f64> = scores(&answers[0]);
    for (display, score) in &expected {
        // Each increment of the second batch counted once on top of the first's scores.
        let set_last = (0..400u32)
            .filter(|i| format!("t{}", i % 150) == *display)
            .any(|i| i % 3 == 0);
        if !set_last {
            assert_eq!(doubled[display], 2.0 * score, "{display}");
        }
    }

    // Another batch under a known id is refused; in another dictionary the id is free.
    let status = client
        .add(batch("r1", 10))
        .await
        .expect_err("r1 belongs to another batch");
    invalid(&status, "request_id");
    let elsewhere = client
        .add(pb::AutocompleteServiceAddRequest {
            dictionary: "other".into(),
            ..batch("r1", 10)
        })
        .await
        .expect("the id is free in another dictionary")
        .into_inner();
    assert_eq!(elsewhere.added, 10);
}

/// A batch with a request id whose steps create ranked sets midway (a prefix passing 256 terms,
/// deep sets, so that steps are refused as too much work and cut where their entries fit), sent
/// at the same time by three callers through two Batons on one Redis, then again: each entry is
/// applied once (increments counted once), every caller gets the same answer, and the ranked
/// sets and every query by score equal the model of the batch applied once.
#[tokio::test]
async fn a_batch_creating_ranked_sets_midway_applies_once_through_two_batons() {
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let (redis, baton, client) = setup().await;
    let (_other, other_client) = other_baton(&redis, &baton).await;
    let d = "midway";
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(20_261_127);
    let mut model = std::collections::BTreeMap::new();
    // 240 terms under "ab" (its set is created past 256) and 400 others: the dictionary is
    // ranked before the batch.
    while model.len() < 640 {
        let display = if model.len() < 240 {
            format!(
                "ab{} {}",
                ["ca", "ba", "nab"][rng.random_range(0..3)],
                rng.random_range(0..100_000)
            )
        } else {
            ranked_term(&mut rng)
        };
        model.insert(display, f64::from(rng.random_range(-20..60)));
    }
    let initial: Vec<pb::AutocompleteTerm> = model.iter().map(|(t, s)| scored(t, *s)).collect();
    add(&mut client.clone(), d, initial).await;
    let existing: Vec<String> = model.keys().cloned().collect();
    // The batch: new terms under "ab" and elsewhere (scores set), increments of existing terms
    // and of the batch's own, in an order that spreads the new "ab" terms over many steps.
    let mut entries = Vec::new();
    let mut fresh = Vec::new();
    for i in 0..1000 {
        let entry = match i % 4 {
            0 => {
                let t = format!(
                    "ab{} {}",
                    ["cab", "zu", "mo"][rng.random_range(0..3)],
                    100_000 + i
                );
                fresh.push(t.clone());
                scored(&t, f64::from(rng.random_range(-20..60)))
            }
            1 => {
                let t = ranked_term(&mut rng);
                fresh.push(t.clone());
                scored(&t, f64::from(rng.random_range(-20..60)))
            }
            2 => pb::AutocompleteTerm {
                increment: true,
                ..scored(
                    &existing[rng.random_range(0..existing.len())],
                    f64::from(rng.random_range(1..9)),
                )
            },
            _ => pb::AutocompleteTerm {
                increment: true,
                ..scored(
                    &fresh[rng.random_range(0..fresh.len())],
                    f64::from(rng.random_range(1..9)),
                )
            },
        };
        entries.push(entry);
    }
    let request = pb::AutocompleteServiceAddRequest {
        dictionary: d.into(),
        terms: entries.clone(),
        request_id: "midway-1".into(),
    };
    let mut calls = JoinSet::new();
    for mut c in [client.clone(), client.clone(), other_client.clone()] {
        let r = request.clone();
        calls.spawn(async move { c.add(r).await.map(tonic::Response::into_inner) });
    }
    let mut answers = Vec::new();
    while let Some(done) = within(Duration::from_secs(120), calls.join_next(), "the calls").await {
        answers.push(done.expect("no panic").expect("Add"));
    }
    let again = other_client
        .clone()
        .add(request.clone())
        .await
        .expect("the batch again")
        .into_inner();
    answers.push(again);
    assert!(
        answers.iter().all(|a| a == &answers[0]),
        "every caller, the same answer"
    );
    // The model: the batch applied once, entry by entry.
    let mut added = 0;
    for (i, e) in entries.iter().enumerate() {
        let score = e.score.expect("a score");
        let now = match model.get(&e.display) {
            Some(old) if e.increment => old + score,
            None if e.increment => score,
            _ => score,
        };
        if !model.contains_key(&e.display) {
            added += 1;
        }
        model.insert(e.display.clone(), now);
        assert_eq!(answers[0].scores[i], now, "entry {i}: {}", e.display);
    }
    assert_eq!(answers[0].added, added);
    assert_eq!(answers[0].updated, 1000 - added);
    assert_eq!(answers[0].term_count, model.len() as u64);
    let mut conn = redis.conn().await;
    let (prefixes, _, _) = check_ranked_sets(&mut conn, baton.prefix(), d, &model).await;
    assert!(prefixes >= 1, "the batch created a prefix's ranked set");
    check_score_queries(&mut client.clone(), d, &model, true).await;
}

/// On a Redis Cluster, an Add or a Remove made while the dictionary's slot is half migrated
/// (the lex set of its term already moved, the term data not yet) changes nothing and fails
/// UNAVAILABLE; Adds (a batch of many steps with a request id among them) go on while the rest
/// of the slot moves, retried when refused; afterwards every term is indexed, found by prefix,
/// by word and by score, and every increment counted once.
#[tokio::test]
async fn adds_during_a_slot_migration_leave_every_term_indexed() {
    if support::TestTopology::from_env() != support::TestTopology::Cluster {
        eprintln!("skipped: needs BATON_TEST_TOPOLOGY=cluster");
        return;
    }
    // Migrates a slot.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let dict = "moving";
    let base: Vec<String> = (0..600)
        .map(|i| format!("{} base {i:03}", ["north", "south", "east", "west"][i % 4]))
        .collect();
    add_all(
        &mut client,
        dict,
        &base.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    let cluster = redis.cluster().expect("a cluster");
    let keys = baton::autocomplete::DictionaryKeys::new(baton.prefix(), dict);
    let slot = support::topology::key_slot(&keys.data);
    let source = cluster.node_for_slot(slot).await;
    let target = cluster
        .masters()
        .await
        .into_iter()
        .find(|m| m.port != source.port)
        .expect("another master");
    let migration = cluster.begin_migration(slot, target.port).await;
    // The lex set of the terms starting with "n" moves ahead of the rest.
    let mut node = cluster.node_client(source.port).await;
    let moved: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(keys.lex(b'n'))
        .query_async(&mut node)
        .await
        .expect("MIGRATE");
    assert_eq!(moved, "OK");
    let newcomer = |i: u32| scored(&format!("newcomer {i}"), f64::from(i));
    let half = client
        .add(pb::AutocompleteServiceAddRequest {
            dictionary: dict.into(),
            terms: vec![newcomer(0)],
            ..Default::default()
        })
        .await;
    let half_removal = client
        .remove(pb::AutocompleteServiceRemoveRequest {
            dictionary: dict.into(),
            displays: vec!["north base 000".into()],
        })
        .await;
    assert_eq!(count(&mut client, dict).await, 600, "nothing was applied");

    // More Adds while the rest of the slot moves, each retried until it is taken.
    let mut writer = client.clone();
    let movers = pb::AutocompleteServiceAddRequest {
        dictionary: dict.into(),
        terms: (0..300)
            .map(|i| pb::AutocompleteTerm {
                display: format!("mover {i:03} of the many steps"),
                score: Some(1.0),
                increment: true,
                payload: None,
            })
            .collect(),
        request_id: "movers".into(),
    };
    let adds = tokio::spawn(async move {
        loop {
            match writer.add(movers.clone()).await {
                Ok(_) => break,
                Err(s) if s.code() == Code::Unavailable => continue,
                Err(s) => panic!("Add of the movers during the migration: {s:?}"),
            }
        }
        for i in 1..=30 {
            loop {
                let r = writer
                    .add(pb::AutocompleteServiceAddRequest {
                        dictionary: dict.into(),
                        terms: vec![newcomer(i)],
                        ..Default::default()
                    })
                    .await;
                match r {
                    Ok(_) => break,
                    Err(s) if s.code() == Code::Unavailable => continue,
                    Err(s) => panic!("Add of newcomer {i} during the migration: {s:?}"),
                }
            }
        }
    });
    migration.finish().await;
    within(
        Duration::from_secs(60),
        adds,
        "the Adds during the migration",
    )
    .await
    .expect("no Add panicked");
    // The refused calls, retried.
    add(&mut client, dict, vec![newcomer(0)]).await;
    assert_eq!(
        remove(&mut client, dict, &["north base 000"]).await.removed,
        1
    );
    let got = all_pages(
        &mut client,
        request(dict, "north base 00", Mode::Prefix, Order::Score, 7),
    )
    .await;
    assert_eq!(displays(&got), ["north base 004", "north base 008"]);
    let got = all_pages(
        &mut client,
        request(dict, "mover", Mode::Prefix, Order::Score, 50),
    )
    .await;
    assert_eq!(got.len(), 300);
    assert!(
        got.iter().all(|s| s.score == 1.0),
        "an increment counted twice"
    );

    let expected: Vec<String> = (0..=30).map(|i| format!("newcomer {i}")).collect();
    for mode in [Mode::Prefix, Mode::WordPrefix, Mode::Contains] {
        for order in [Order::Lexicographic, Order::Score] {
            let got = all_pages(&mut client, request(dict, "newcomer", mode, order, 7)).await;
            let mut names = displays(&got);
            names.sort_by_key(|d| d.trim_start_matches("newcomer ").parse::<u32>().unwrap());
            assert_eq!(names, expected, "{mode:?} {order:?}");
            for s in &got {
                let i: f64 = s.display.trim_start_matches("newcomer ").parse().unwrap();
                assert_eq!(s.score, i, "{}", s.display);
            }
        }
    }
    assert_eq!(count(&mut client, dict).await, 600 - 1 + 31 + 300);
    let status = half.expect_err("an Add across a half-migrated slot cannot run");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let status = half_removal.expect_err("a Remove across a half-migrated slot cannot run");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

/// An Add whose caller's deadline comes before Baton has even checked, normalized and planned
/// its batch (1000 of the longest terms, upper case to fold, a deadline of a second) answers
/// UNAVAILABLE a fifth of the deadline before it, naming its request id as a batch cut between
/// steps does, rather than answer after the preparation, past the deadline (the client gives
/// up at the deadline: `CANCELLED`); sent again with the id and no deadline, the whole batch is
/// applied.
#[tokio::test]
async fn add_not_ready_by_the_callers_deadline_answers_in_time() {
    // A fifth of it (200 ms) is left for the answer to reach the client on a busy machine. The
    // preparation alone takes longer than the deadline in a debug build.
    const DEADLINE: Duration = Duration::from_secs(1);
    let (_redis, _baton, mut client) = setup().await;
    let batch = pb::AutocompleteServiceAddRequest {
        dictionary: "not-ready".into(),
        terms: heaviest_displays(1000, 7)
            .into_iter()
            .map(|display| pb::AutocompleteTerm {
                display: display.to_uppercase(),
                score: Some(1.0),
                ..Default::default()
            })
            .collect(),
        request_id: "not-ready-1".into(),
    };
    let mut call = tonic::Request::new(batch.clone());
    call.set_timeout(DEADLINE);
    let status = within(Duration::from_secs(60), client.add(call), "the Add")
        .await
        .expect_err("a batch this large is not applied in a second");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("deadline"),
        "stopped by the deadline: {status:?}"
    );
    assert_eq!(
        request_id_of(&status).as_deref(),
        Some("not-ready-1"),
        "{status:?}"
    );
    let answer = within(Duration::from_secs(60), client.add(batch), "the retry")
        .await
        .expect("the batch sent again")
        .into_inner();
    assert_eq!(answer.added + answer.updated, 1000);
    assert_eq!(answer.term_count, 1000);
}
