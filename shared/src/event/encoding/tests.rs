use super::*;

#[derive(Deserialize)]
struct Ints {
    #[serde(with = "int64")]
    value: i64,
    #[serde(default, with = "opt_int64")]
    optional: Option<i64>,
}

#[derive(Deserialize)]
struct Ids {
    #[serde(default, with = "opt_id")]
    id: Option<Id>,
}

ray_enum! {
    enum Colour { RED = 0, GREEN = 1 }
}

#[test]
fn base64_ids_become_lowercase_hex() -> Result<(), Box<dyn std::error::Error>> {
    // The driver-submitted parent task id from reference §2.1.
    let id = Id::from_base64("//////////////////////////8BAAAA")?.ok_or("empty")?;
    assert_eq!(
        id.as_hex(),
        "ffffffffffffffffffffffffffffffffffffffff01000000"
    );
    assert_eq!(id.byte_len(), 24);
    let task = Id::from_base64("yO9FzNARJXH///////////////8BAAAA")?.ok_or("empty")?;
    assert_eq!(
        task.as_hex(),
        "c8ef45ccd0112571ffffffffffffffffffffffff01000000"
    );
    Ok(())
}

#[test]
fn empty_and_absent_ids_are_none() -> Result<(), serde_json::Error> {
    assert_eq!(serde_json::from_str::<Ids>(r#"{"id": ""}"#)?.id, None);
    assert_eq!(serde_json::from_str::<Ids>(r#"{}"#)?.id, None);
    assert_eq!(serde_json::from_str::<Ids>(r#"{"id": null}"#)?.id, None);
    Ok(())
}

#[test]
fn equal_ids_read_together_share_one_text() -> Result<(), base64::DecodeError> {
    let job = "AQAAAA==";
    let read =
        || -> Result<_, base64::DecodeError> { Ok([Id::from_base64(job)?, Id::from_base64(job)?]) };
    let [Some(first), Some(second)] = with_shared_ids(read)? else {
        panic!("{job} is an id");
    };
    assert!(Arc::ptr_eq(&first.0, &second.0), "shared inside the scope");
    let [Some(after), Some(again)] = read()? else {
        panic!("{job} is an id");
    };
    assert!([&second, &after, &again].iter().all(|id| **id == first));
    assert!(
        !Arc::ptr_eq(&after.0, &first.0) && !Arc::ptr_eq(&after.0, &again.0),
        "forgotten when the scope ends"
    );
    Ok(())
}

#[test]
fn an_events_own_id_is_its_bytes_and_a_nested_scope_leaves_the_outer_ids()
-> Result<(), Box<dyn std::error::Error>> {
    // A node id and an event id of the same 28 bytes, in one event.
    let same = BASE64.encode([7u8; 28]);
    let line = format!(
        r#"{{"eventId": "{same}", "nodeId": "{same}", "eventType": "NODE_DEFINITION_EVENT", "nodeDefinitionEvent": {{"nodeId": "{same}"}}}}"#
    );
    let (event, before, after) = with_shared_ids(|| {
        let before = Id::from_base64(&same);
        let event = crate::event::RayEvent::from_json(&line);
        let after = with_shared_ids(|| Id::from_base64(&same)).and(Id::from_base64(&same));
        (event, before, after)
    });
    let (event, before, after) = (event?, before?, after?);
    let (Some(event_id), Some(node_id), Some(before), Some(after)) =
        (event.event_id, event.node_id, before, after)
    else {
        panic!("every id is set");
    };
    assert_eq!(event_id.as_bytes(), [7u8; 28]);
    assert_eq!(event_id.to_base64(), same);
    assert!(Arc::ptr_eq(&node_id.0, &before.0), "the node id is shared");
    assert!(
        Arc::ptr_eq(&after.0, &before.0),
        "the outer scope's ids outlive an inner one"
    );
    Ok(())
}

#[test]
fn event_ids_of_any_length_keep_their_bytes_and_compare_by_them() {
    let ids: Vec<EventId> = [0, 1, 28, 31, 32, 40]
        .into_iter()
        .map(|length| EventId::from_bytes(&vec![0xab; length]))
        .collect();
    for (id, length) in ids.iter().zip([0, 1, 28, 31, 32, 40]) {
        assert_eq!(id.as_bytes(), vec![0xab; length]);
        assert_eq!(
            EventId::from_base64(&id.to_base64())
                .ok()
                .flatten()
                .as_ref(),
            (length > 0).then_some(id)
        );
    }
    // The same bytes at other lengths are other ids; equal bytes are one id.
    for (index, id) in ids.iter().enumerate() {
        for (other_index, other) in ids.iter().enumerate() {
            assert_eq!(id == other, index == other_index);
        }
    }
    assert_eq!(EventId::from_bytes(&[0; 2]), EventId::from_bytes(&[0, 0]));
    assert_ne!(EventId::from_bytes(&[0; 2]), EventId::from_bytes(&[0; 3]));
    assert_eq!(
        format!("{:?}", EventId::from_bytes(&[0x0f, 0xa0])),
        "EventId(0fa0)"
    );
}

#[test]
fn invalid_base64_is_an_error_naming_the_text() {
    let err = serde_json::from_str::<Ids>(r#"{"id": "not base64!"}"#).err();
    assert!(err.is_some_and(|err| err.to_string().contains("not base64!")));
}

#[test]
fn nil_ids_are_all_ff() -> Result<(), Box<dyn std::error::Error>> {
    let nil_pg = Id::from_base64("////////////////////////")?.ok_or("empty")?;
    assert!(nil_pg.is_nil());
    assert_eq!(nil_pg.byte_len(), 18);
    let job = Id::from_base64("AQAAAA==")?.ok_or("empty")?;
    assert!(!job.is_nil());
    assert_eq!(job.as_hex(), "01000000");
    Ok(())
}

#[test]
fn int64_accepts_strings_and_numbers() -> Result<(), serde_json::Error> {
    let ints: Ints = serde_json::from_str(r#"{"value": "1795328096960093697"}"#)?;
    assert_eq!(ints.value, 1_795_328_096_960_093_697);
    assert_eq!(ints.optional, None);
    let ints: Ints = serde_json::from_str(r#"{"value": 15318, "optional": "-32"}"#)?;
    assert_eq!(ints.value, 15318);
    assert_eq!(ints.optional, Some(-32));
    assert!(serde_json::from_str::<Ints>(r#"{"value": "12x"}"#).is_err());
    assert!(serde_json::from_str::<Ints>(r#"{"value": 1.5}"#).is_err());
    Ok(())
}

#[test]
fn ids_and_timestamps_read_in_place_escaped_or_not_and_null_is_unset()
-> Result<(), serde_json::Error> {
    // `\u0041` is `A`: an escaped string reaches the reader through the parser's buffer.
    let escaped: Ids = serde_json::from_str(r#"{"id": "\u0041QAAAA=="}"#)?;
    assert_eq!(
        escaped.id.map(|id| id.to_string()),
        Some("01000000".to_owned())
    );
    let null: Ids = serde_json::from_str(r#"{"id": null}"#)?;
    assert_eq!(null.id, None);
    let time: Timestamp = serde_json::from_str(r#""2026-11-22T06:14:54\u002E5Z""#)?;
    assert_eq!(
        time,
        Timestamp::parse_rfc3339("2026-11-22T06:14:54.5Z").map_err(serde::de::Error::custom)?
    );
    let err = serde_json::from_str::<Timestamp>("null").err();
    assert!(err.is_some_and(|err| err.to_string().contains("null")));
    Ok(())
}

#[test]
fn timestamps_take_zero_to_nine_fraction_digits() -> Result<(), TimestampError> {
    let whole = Timestamp::parse_rfc3339("2026-11-22T06:14:54Z")?;
    for (text, extra_nanos) in [
        ("2026-11-22T06:14:54.6Z", 600_000_000),
        ("2026-11-22T06:14:54.627Z", 627_000_000),
        ("2026-11-22T06:14:54.629442Z", 629_442_000),
        ("2026-11-22T06:14:54.629442378Z", 629_442_378),
        ("2026-11-22T06:14:54.000000001Z", 1),
    ] {
        assert_eq!(
            Timestamp::parse_rfc3339(text)?.nanos() - whole.nanos(),
            extra_nanos,
            "{text}"
        );
    }
    assert_eq!(whole.nanos(), 1_795_328_094_000_000_000);
    assert_eq!(whole.millis(), 1_795_328_094_000);
    let offset = Timestamp::parse_rfc3339("2026-11-22T07:14:54+01:00")?;
    assert_eq!(offset, whole);
    assert!(Timestamp::parse_rfc3339("2026-11-22 06:14:54").is_err());
    assert!(Timestamp::parse_rfc3339("yesterday").is_err());
    Ok(())
}

#[test]
fn the_fast_reading_of_utc_times_is_chronos_reading() {
    let chrono = |text: &str| {
        chrono::DateTime::parse_from_rfc3339(text)
            .ok()
            .and_then(|time| time.timestamp_nanos_opt())
    };
    // Instants spread over the years the fast reading takes (1970 to 2261: 2262-01-01 is
    // second 9 214 646 400), leap and common years alike, printed with each count of
    // fraction digits.
    let mut seconds: i64 = 0;
    let mut checked = 0;
    while seconds < 9_214_646_400 {
        for nanos in [0, 5, 999_999_999, 123_456_789] {
            let time = chrono::DateTime::from_timestamp(seconds, nanos).unwrap_or_default();
            for digits in 0..=9 {
                let mut text = time.format("%Y-%m-%dT%H:%M:%S").to_string();
                if digits > 0 {
                    let fraction = format!("{nanos:09}");
                    text = format!("{text}.{}", &fraction[..digits]);
                }
                text.push('Z');
                assert_eq!(parse_utc(text.as_bytes()), chrono(&text), "{text}");
                checked += 1;
            }
        }
        seconds += 86_400 * 29 + 3_599;
    }
    assert!(checked > 100_000, "{checked}");
    // What it leaves to chrono: no date, offsets, leap seconds, lowercase, ten digits, and
    // years it does not take.
    for text in [
        "2023-02-29T00:00:00Z",
        "2024-02-30T00:00:00Z",
        "2026-04-31T00:00:00Z",
        "2026-13-01T00:00:00Z",
        "2026-11-22T24:00:00Z",
        "2026-11-22T06:60:00Z",
        "2016-12-31T23:59:60Z",
        "2026-11-22T07:14:54+01:00",
        "2026-11-22t06:14:54z",
        "2026-11-22T06:14:54.Z",
        "2026-11-22T06:14:54.1234567890Z",
        "2026-11-22T06:14:5xZ",
        "1969-12-31T23:59:59Z",
        "2262-01-01T00:00:00Z",
        "2026-11-22T06:14:54",
        "2026-11-22",
    ] {
        assert_eq!(parse_utc(text.as_bytes()), None, "{text}");
    }
    assert_eq!(
        parse_utc(b"2024-02-29T23:59:59.5Z"),
        chrono("2024-02-29T23:59:59.5Z")
    );
}

#[test]
fn timestamps_are_written_as_protobuf_prints_them() -> Result<(), TimestampError> {
    // Protobuf's JSON printer uses 0, 3, 6 or 9 fraction digits, the fewest that are exact
    // (captured node definitions have `startTimestamp`s like `…:37.651Z`).
    for text in [
        "2026-11-22T06:14:54Z",
        "2026-11-22T06:14:54.600Z",
        "2026-11-22T06:14:54.629442Z",
        "2026-11-22T06:14:54.629442378Z",
        "2026-11-22T06:14:54.000000001Z",
        "1969-12-31T23:59:59.999Z",
    ] {
        assert_eq!(Timestamp::parse_rfc3339(text)?.to_string(), text);
    }
    Ok(())
}

#[test]
fn ids_write_back_as_the_base64_they_were_read_from() -> Result<(), base64::DecodeError> {
    for text in [
        "//////////////////////////8BAAAA",
        "AQAAAA==",
        "CPIoGPtX5DmhSrfP6qC5bD2pqJtAy2bpi8HCNQ==",
    ] {
        let id = Id::from_base64(text)?;
        assert_eq!(id.map(|id| id.to_base64()).as_deref(), Some(text));
    }
    Ok(())
}

#[test]
fn enums_read_names_numbers_and_keep_unknown_names() -> Result<(), serde_json::Error> {
    assert_eq!(serde_json::from_str::<Colour>(r#""GREEN""#)?, Colour::GREEN);
    assert_eq!(serde_json::from_str::<Colour>("1")?, Colour::GREEN);
    assert_eq!(serde_json::from_str::<Colour>("null")?, Colour::RED);
    let future = serde_json::from_str::<Colour>(r#""ULTRAVIOLET""#)?;
    assert_eq!(future, Colour::Unknown("ULTRAVIOLET".into()));
    assert_eq!(future.as_str(), "ULTRAVIOLET");
    assert_eq!(future.number(), None);
    assert_eq!(Colour::default(), Colour::RED);
    Ok(())
}
