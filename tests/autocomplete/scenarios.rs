//! Whole uses: a guild's member names, recent contacts, automatic mode.

use super::*;

/// Players join and leave a guild; prefix completion over the member list follows at once.
#[tokio::test]
async fn guild_join_leave_then_prefix_completion() {
    let (_redis, _baton, mut client) = setup().await;
    let guild = "members:guild-7";
    add_all(
        &mut client,
        guild,
        &[
            "jack",
            "jacob",
            "jacqueline",
            "james",
            "jane",
            "Jabba",
            "bob",
        ],
    )
    .await;
    assert_eq!(count(&mut client, guild).await, 7);
    assert_eq!(
        complete(
            &mut client,
            guild,
            "ja",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await,
        ["Jabba", "jack", "jacob", "jacqueline", "james", "jane"]
    );
    // The default limit is 10, and results stop at the limit.
    assert_eq!(
        complete(
            &mut client,
            guild,
            "jac",
            Mode::Unspecified,
            Order::Unspecified,
            2
        )
        .await,
        ["jack", "jacob"]
    );

    // Leaving: jack and jacob go; an unknown member is ignored.
    let left = remove(&mut client, guild, &["jack", "jacob", "nobody"]).await;
    assert_eq!((left.removed, left.term_count), (2, 5));
    assert_eq!(
        complete(
            &mut client,
            guild,
            "jac",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await,
        ["jacqueline"]
    );
    // Joining again.
    add_all(&mut client, guild, &["jack"]).await;
    assert_eq!(
        complete(
            &mut client,
            guild,
            "JAC",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await,
        ["jack", "jacqueline"]
    );
    // Other guilds are separate.
    assert!(
        complete(
            &mut client,
            "members:guild-8",
            "ja",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await
        .is_empty()
    );
    assert_eq!(count(&mut client, "members:guild-8").await, 0);
}

/// Recent contacts: at most 100 kept, recording again moves to the front, removal works, and
/// completion over the list goes most recent first.
#[tokio::test]
async fn recent_contacts_capped_at_100_with_move_to_front_and_removal() {
    let (redis, baton, mut client) = setup().await;
    let reader = client.clone();
    let list = "recent:user-42";
    let record = |display: String| pb::AutocompleteServiceRecordRecentRequest {
        list: list.to_owned(),
        display,
        ..Default::default()
    };
    let mut last = None;
    for i in 0..105 {
        let r = client
            .record_recent(record(format!("contact {i:03}")))
            .await
            .expect("RecordRecent")
            .into_inner();
        assert_eq!(r.size, (i + 1).min(100));
        assert_eq!(r.evicted, u32::from(i >= 100));
        let at = r.recorded_at.expect("recorded_at");
        if let Some(prev) = last.replace(at) {
            assert!(
                (at.seconds, at.nanos) > (prev.seconds, prev.nanos),
                "recorded_at increases"
            );
        }
    }
    let list_all = |_: &mut Client| {
        let mut client = reader.clone();
        async move {
            let mut items = Vec::new();
            let mut token = String::new();
            loop {
                let r = client
                    .list_recent(pb::AutocompleteServiceListRecentRequest {
                        list: list.to_owned(),
                        limit: 30,
                        page_token: token,
                    })
                    .await
                    .expect("ListRecent")
                    .into_inner();
                items.extend(r.items.into_iter().map(|i| i.display));
                if r.next_page_token.is_empty() {
                    return items;
                }
                token = r.next_page_token;
            }
        }
    };
    let items = list_all(&mut client).await;
    let expected: Vec<String> = (5..105).rev().map(|i| format!("contact {i:03}")).collect();
    assert_eq!(items, expected, "the 100 most recent, newest first");

    // Move to front.
    client
        .record_recent(record("contact 010".into()))
        .await
        .expect("RecordRecent");
    let items = list_all(&mut client).await;
    assert_eq!(items.len(), 100);
    assert_eq!(items[0], "contact 010");
    assert_eq!(items.iter().filter(|d| *d == "contact 010").count(), 1);

    // Removal.
    let removed = client
        .remove_recent(pb::AutocompleteServiceRemoveRecentRequest {
            list: list.to_owned(),
            displays: vec![
                "contact 010".into(),
                "contact 104".into(),
                "stranger".into(),
            ],
        })
        .await
        .expect("RemoveRecent")
        .into_inner();
    assert_eq!((removed.removed, removed.size), (2, 98));
    let items = list_all(&mut client).await;
    assert_eq!(items[0], "contact 103");
    assert!(!items.contains(&"contact 010".to_owned()));

    // Completion over the list, most recent first; a record past the cap evicts the oldest.
    let complete_recent = |query: &str, mode: Mode| pb::AutocompleteServiceCompleteRecentRequest {
        list: list.to_owned(),
        query: query.to_owned(),
        limit: 5,
        mode: mode as i32,
        page_token: String::new(),
    };
    let found = client
        .complete_recent(complete_recent("CONTACT 09", Mode::Prefix))
        .await
        .expect("CompleteRecent")
        .into_inner();
    let names: Vec<_> = found.items.iter().map(|i| i.display.as_str()).collect();
    assert_eq!(
        names,
        [
            "contact 099",
            "contact 098",
            "contact 097",
            "contact 096",
            "contact 095"
        ]
    );
    assert!(!found.next_page_token.is_empty());
    let found = client
        .complete_recent(complete_recent("t 10", Mode::Contains))
        .await
        .expect("CompleteRecent")
        .into_inner();
    let names: Vec<_> = found.items.iter().map(|i| i.display.as_str()).collect();
    assert_eq!(
        names,
        ["contact 103", "contact 102", "contact 101", "contact 100"]
    );
    assert!(found.items.iter().all(|i| i.match_kind() == Kind::Contains));

    // Both keys of the list expire (the default ttl is 90 days).
    let mut conn = redis.conn().await;
    for key in [
        format!("{}{{acr:{list}}}", baton.prefix()),
        format!("{}{{acr:{list}}}:items", baton.prefix()),
    ] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(
            ttl > 89 * 24 * 3600 * 1000,
            "{key} expires in about 90 days: {ttl}"
        );
    }
}

/// Automatic mode: exact matches, then prefix, then word-prefix, then contains, each term once,
/// stopping at the limit, and paging across the groups.
#[tokio::test]
async fn automatic_mode_orders_exact_prefix_word_prefix_contains() {
    let (_redis, _baton, mut client) = setup().await;
    let d = "people";
    add_all(
        &mut client,
        d,
        &[
            "Anna Karenina",
            "anna",
            "Hanna Schmidt",
            "Ann",
            "Joanna Anna",
            "Annabel Lee",
            "Marianne",
            "Zed",
        ],
    )
    .await;
    let all = all_pages(
        &mut client,
        request(d, "ann", Mode::Automatic, Order::Lexicographic, 10),
    )
    .await;
    let got: Vec<(String, Kind)> = all
        .iter()
        .map(|s| (s.display.clone(), s.match_kind()))
        .collect();
    assert_eq!(
        got,
        [
            ("Ann".to_owned(), Kind::Exact),
            ("anna".to_owned(), Kind::Prefix),
            ("Anna Karenina".to_owned(), Kind::Prefix),
            ("Annabel Lee".to_owned(), Kind::Prefix),
            ("Joanna Anna".to_owned(), Kind::WordPrefix),
            ("Hanna Schmidt".to_owned(), Kind::Contains),
            ("Marianne".to_owned(), Kind::Contains),
        ]
    );
    // Stopping at the limit, then going on from where the page stopped, across groups.
    for limit in 1..=7 {
        let paged = all_pages(
            &mut client,
            request(d, "ann", Mode::Automatic, Order::Lexicographic, limit),
        )
        .await;
        assert_eq!(displays(&paged), displays(&all), "limit {limit}");
    }
    let first = complete(
        &mut client,
        d,
        "ann",
        Mode::Automatic,
        Order::Lexicographic,
        3,
    )
    .await;
    assert_eq!(first, ["Ann", "anna", "Anna Karenina"]);
    // Each group by score when asked.
    add(
        &mut client,
        d,
        vec![
            scored("Annabel Lee", 5.0),
            scored("Marianne", 9.0),
            scored("Hanna Schmidt", 1.0),
        ],
    )
    .await;
    let ranked = all_pages(
        &mut client,
        request(d, "ann", Mode::Automatic, Order::Score, 2),
    )
    .await;
    assert_eq!(
        displays(&ranked),
        [
            "Ann",
            "Annabel Lee",
            "anna",
            "Anna Karenina",
            "Joanna Anna",
            "Marianne",
            "Hanna Schmidt"
        ]
    );
}
