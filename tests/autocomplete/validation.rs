//! Validation.

use super::*;

/// Every bad input fails with INVALID_ARGUMENT naming the field, and changes nothing.
#[tokio::test]
async fn validation_failures_name_the_field_and_change_nothing() {
    let (_redis, _baton, mut client) = setup().await;
    let reader = client.clone();
    let d = "valid";
    add_all(&mut client, d, &["kept"]).await;
    let add_err = |terms: Vec<pb::AutocompleteTerm>, dictionary: &str| {
        let mut client = reader.clone();
        let dictionary = dictionary.to_owned();
        async move {
            client
                .add(pb::AutocompleteServiceAddRequest {
                    dictionary,
                    terms,
                    ..Default::default()
                })
                .await
                .expect_err("Add should fail")
        }
    };
    invalid(&add_err(vec![term("x")], "").await, "dictionary");
    invalid(
        &add_err(vec![term("x")], &"d".repeat(257)).await,
        "dictionary",
    );
    invalid(&add_err(vec![], d).await, "terms");
    invalid(
        &add_err((0..1001).map(|i| term(&i.to_string())).collect(), d).await,
        "terms",
    );
    invalid(
        &add_err(vec![term("ok"), term("")], d).await,
        "terms[1].display",
    );
    invalid(&add_err(vec![term(" \t ")], d).await, "terms[0].display");
    let status = client
        .add(pb::AutocompleteServiceAddRequest {
            dictionary: d.into(),
            terms: vec![term("x")],
            request_id: "r".repeat(129),
        })
        .await
        .expect_err("Add should fail");
    invalid(&status, "request_id");
    invalid(&add_err(vec![term("a\0b")], d).await, "terms[0].display");
    invalid(
        &add_err(vec![term(&"é".repeat(129))], d).await,
        "terms[0].display",
    );
    invalid(
        &add_err(
            vec![
                term("ok"),
                term("ok2"),
                pb::AutocompleteTerm {
                    display: "p".into(),
                    payload: Some(vec![1; 1025]),
                    ..Default::default()
                },
            ],
            d,
        )
        .await,
        "terms[2].payload",
    );
    for bad in [f64::NAN, f64::INFINITY, 1e16, -1e16] {
        invalid(&add_err(vec![scored("s", bad)], d).await, "terms[0].score");
    }
    invalid(
        &add_err(
            vec![pb::AutocompleteTerm {
                display: "s".into(),
                increment: true,
                ..Default::default()
            }],
            d,
        )
        .await,
        "terms[0].score",
    );
    // An increment overflowing the bound, found inside Redis: the whole batch is rejected.
    add(&mut client, d, vec![scored("big", 9e14)]).await;
    let overflow = vec![
        term("new one"),
        pb::AutocompleteTerm {
            display: "big".into(),
            score: Some(9e14),
            increment: true,
            ..Default::default()
        },
    ];
    invalid(&add_err(overflow, d).await, "terms[1].score");
    assert_eq!(
        count(&mut client, d).await,
        2,
        "nothing of the rejected batch was applied"
    );
    assert!(
        complete(
            &mut client,
            d,
            "new",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await
        .is_empty()
    );

    // Remove.
    let remove_err = |displays: Vec<String>| {
        let mut client = reader.clone();
        async move {
            client
                .remove(pb::AutocompleteServiceRemoveRequest {
                    dictionary: d.into(),
                    displays,
                })
                .await
                .expect_err("Remove should fail")
        }
    };
    invalid(&remove_err(vec![]).await, "displays");
    invalid(
        &remove_err(vec!["kept".into(), String::new()]).await,
        "displays[1]",
    );
    invalid(
        &remove_err((0..1001).map(|i| i.to_string()).collect()).await,
        "displays",
    );
    assert_eq!(count(&mut client, d).await, 2);

    // Complete.
    let complete_err = |req: pb::AutocompleteServiceCompleteRequest| {
        let mut client = reader.clone();
        async move {
            client
                .complete(req)
                .await
                .expect_err("Complete should fail")
        }
    };
    let ok = request(d, "k", Mode::Prefix, Order::Lexicographic, 10);
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            query: String::new(),
            ..ok.clone()
        })
        .await,
        "query",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            query: "   ".into(),
            ..ok.clone()
        })
        .await,
        "query",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            query: "q".repeat(257),
            ..ok.clone()
        })
        .await,
        "query",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            limit: 1001,
            ..ok.clone()
        })
        .await,
        "limit",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            mode: 42,
            ..ok.clone()
        })
        .await,
        "mode",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            order: -1,
            ..ok.clone()
        })
        .await,
        "order",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            dictionary: String::new(),
            ..ok.clone()
        })
        .await,
        "dictionary",
    );
    for token in ["garbage", "AAAA", "!!", "eyJhIjoxfQ"] {
        invalid(
            &complete_err(pb::AutocompleteServiceCompleteRequest {
                page_token: token.into(),
                ..ok.clone()
            })
            .await,
            "page_token",
        );
    }
    // A real token, tampered with or used for another query.
    add_all(&mut client, d, &["k1", "k2", "k3"]).await;
    let first = page(
        &mut client,
        pb::AutocompleteServiceCompleteRequest {
            limit: 1,
            ..ok.clone()
        },
    )
    .await;
    assert!(!first.next_page_token.is_empty());
    let mut tampered = first.next_page_token.clone().into_bytes();
    let at = tampered.len() / 2;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            page_token: String::from_utf8(tampered).unwrap(),
            limit: 1,
            ..ok.clone()
        })
        .await,
        "page_token",
    );
    let other = pb::AutocompleteServiceCompleteRequest {
        query: "k1".into(),
        page_token: first.next_page_token.clone(),
        limit: 1,
        ..ok.clone()
    };
    invalid(&complete_err(other).await, "page_token");
    let other = pb::AutocompleteServiceCompleteRequest {
        order: Order::Score as i32,
        page_token: first.next_page_token.clone(),
        limit: 1,
        ..ok.clone()
    };
    invalid(&complete_err(other).await, "page_token");

    // Recent lists.
    let record_err = |req: pb::AutocompleteServiceRecordRecentRequest| {
        let mut client = reader.clone();
        async move {
            client
                .record_recent(req)
                .await
                .expect_err("RecordRecent should fail")
        }
    };
    let ok = pb::AutocompleteServiceRecordRecentRequest {
        list: "l".into(),
        display: "x".into(),
        ..Default::default()
    };
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            list: String::new(),
            ..ok.clone()
        })
        .await,
        "list",
    );
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            display: String::new(),
            ..ok.clone()
        })
        .await,
        "display",
    );
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            max_items: 1001,
            ..ok.clone()
        })
        .await,
        "max_items",
    );
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            ttl: Some(ms(10)),
            ..ok.clone()
        })
        .await,
        "ttl",
    );
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            payload: Some(vec![0; 1025]),
            ..ok.clone()
        })
        .await,
        "payload",
    );
    let list_err = client
        .list_recent(pb::AutocompleteServiceListRecentRequest {
            list: "l".into(),
            limit: 1001,
            page_token: String::new(),
        })
        .await
        .expect_err("ListRecent should fail");
    invalid(&list_err, "limit");
    let list_err = client
        .list_recent(pb::AutocompleteServiceListRecentRequest {
            list: "l".into(),
            limit: 1,
            page_token: "nope".into(),
        })
        .await
        .expect_err("ListRecent should fail");
    invalid(&list_err, "page_token");
    let complete_recent_err = client
        .complete_recent(pb::AutocompleteServiceCompleteRecentRequest {
            list: "l".into(),
            query: String::new(),
            ..Default::default()
        })
        .await
        .expect_err("CompleteRecent should fail");
    invalid(&complete_recent_err, "query");
    let remove_recent_err = client
        .remove_recent(pb::AutocompleteServiceRemoveRecentRequest {
            list: "l".into(),
            displays: vec![],
        })
        .await
        .expect_err("RemoveRecent should fail");
    invalid(&remove_recent_err, "displays");
}
