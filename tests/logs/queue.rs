//! Log requests through moto's SQS: queued by ingest, stored a batch at a time by the log store
//! function, read back exactly; re-sends of stored bytes checked at once, rewrites inside one
//! batch window refused where they differ, unreadable messages kept for the dead-letter queue.

use std::sync::Arc;
use std::time::Duration;

use afterglow_tests::faults::RecordsRequests;
use afterglow_tests::moto::Moto;
use anyhow::ensure;
use shared::ingest::{IngestAccess, IngestLimits, Ingestor};
use shared::keys::{ClusterName, LogFileName, NodeId, NodeLogs, SessionName};
use shared::logs::queue::drain::{DrainLimits, Received, store_batch};
use shared::logs::queue::message::QueuedPieces;
use shared::logs::queue::shard::{QueueShards, shard_of};
use shared::logs::queue::sqs::SqsLogQueue;
use shared::logs::read::{list_files, read_range};
use shared::logs::store::{PieceOutcome, ReadPiece};
use shared::storage::Storage;

use super::{ALL, log_file};

/// Every message on the queue (at least `count`, waiting up to 10 s for them), each with an id
/// of its own.
async fn receive_all(
    moto: &Moto,
    queue_url: &str,
    count: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    let bodies = moto
        .receive(queue_url, count, Duration::from_secs(10))
        .await?;
    Ok(bodies
        .into_iter()
        .enumerate()
        .map(|(at, body)| (format!("m{at}"), body))
        .collect())
}

/// Runs the log store function on `messages` as Lambda delivers them; returns the ids it asks
/// to have delivered again.
async fn log_store(
    storage: &Arc<dyn Storage>,
    messages: &[(String, String)],
) -> anyhow::Result<Vec<String>> {
    let records: Vec<serde_json::Value> = messages
        .iter()
        .map(|(id, body)| {
            serde_json::json!({
                "messageId": id, "eventSource": "aws:sqs", "body": body,
                "attributes": {}, "messageAttributes": {}
            })
        })
        .collect();
    let event = serde_json::from_value(serde_json::json!({ "Records": records }))?;
    let response = afterglow::log_store::handle(
        storage,
        lambda_runtime::LambdaEvent::new(event, lambda_runtime::Context::default()),
    )
    .await
    .map_err(|err| anyhow::anyhow!("{err}"))?;
    Ok(response
        .batch_item_failures
        .into_iter()
        .map(|failure| failure.item_identifier)
        .collect())
}

/// Sends one request of `pieces` through `ingestor`, a few milliseconds after the last, so the
/// requests of a test are in the order sent.
async fn send(
    ingestor: &Ingestor,
    node: &NodeLogs,
    pieces: &[(&LogFileName, u64, &[u8])],
) -> anyhow::Result<Vec<PieceOutcome>> {
    tokio::time::sleep(Duration::from_millis(3)).await;
    let pieces: Vec<ReadPiece<'_>> = pieces
        .iter()
        .map(|(file, offset, bytes)| ReadPiece {
            file: (*file).clone(),
            offset: *offset,
            bytes,
        })
        .collect();
    Ok(ingestor.ingest_log_pieces(node, &pieces).await?)
}

async fn read(
    storage: &dyn Storage,
    node: &NodeLogs,
    file: &LogFileName,
) -> anyhow::Result<Vec<u8>> {
    let range = read_range(storage, &node.file(file.clone()), 0, None, ALL).await?;
    ensure!(range.complete, "{range:?}");
    Ok(range.bytes)
}

async fn requests_are_queued_and_stored_a_batch_at_a_time(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let Some(moto) = Moto::start("requests_are_queued_and_stored_a_batch_at_a_time").await? else {
        return Ok(());
    };
    let queue_url = moto.create_queue("afterglow-logs").await?;
    let ingestor = Ingestor::new(
        Arc::clone(&storage),
        IngestAccess::Open,
        IngestLimits::default(),
    )
    .with_log_queue(Arc::new(SqsLogQueue::new(
        moto.sqs(),
        QueueShards::one(queue_url.clone()),
    )));
    let node = log_file("worker-q-01000000-1.out")?.node();
    let out = LogFileName::new("worker-q-01000000-1.out")?;
    let err = LogFileName::new("worker-q-01000000-1.err")?;

    // Three intervals of a shipper: every piece is queued, and nothing is stored yet.
    let sent = [
        send(
            &ingestor,
            &node,
            &[(&out, 0, b"step 1\n"), (&err, 0, b"warn a\n")],
        )
        .await?,
        send(&ingestor, &node, &[(&out, 7, b"step 2\n")]).await?,
        send(
            &ingestor,
            &node,
            &[(&out, 14, b"step 3\n"), (&err, 7, b"warn b\n")],
        )
        .await?,
    ];
    let queued = |end| PieceOutcome::Queued { end };
    ensure!(
        sent == [
            vec![queued(7), queued(7)],
            vec![queued(14)],
            vec![queued(21), queued(14)]
        ],
        "{sent:?}"
    );
    ensure!(
        list_files(&*storage, &node).await?.is_empty(),
        "stored before the batch"
    );

    // The log store function stores the batch: one segment for the three requests.
    let messages = receive_all(&moto, &queue_url, 3).await?;
    ensure!(messages.len() == 3, "{messages:?}");
    let recorder = Arc::new(RecordsRequests::new(Arc::clone(&storage)));
    let recording: Arc<dyn Storage> = recorder.clone();
    let again = log_store(&recording, &messages).await?;
    ensure!(again.is_empty(), "asked to redeliver {again:?}");
    let recorded = recorder.puts();
    ensure!(
        recorded == [node.index_key()?.as_str()],
        "one write per batch, the bytes inline in the index: {recorded:?}"
    );
    ensure!(read(&*storage, &node, &out).await? == b"step 1\nstep 2\nstep 3\n");
    ensure!(read(&*storage, &node, &err).await? == b"warn a\nwarn b\n");

    // A re-send of stored bytes is checked at once, not queued.
    let resent = send(&ingestor, &node, &[(&out, 0, b"step 1\nstep 2\n")]).await?;
    ensure!(
        resent == [PieceOutcome::Stored { stored: 0, end: 14 }],
        "{resent:?}"
    );
    ensure!(
        receive_all(&moto, &queue_url, 0).await?.is_empty(),
        "a re-send was queued"
    );

    // Inside one batch window, a rewrite meets only queued bytes: it is queued too, and the
    // log store keeps the first sent and refuses where the second differs. A message that is
    // not one of ours is asked for again, for the dead-letter queue to keep.
    send(&ingestor, &node, &[(&out, 21, b"step 4\n")]).await?;
    send(&ingestor, &node, &[(&out, 21, b"other\n\n")]).await?;
    moto.sqs()
        .send_message()
        .queue_url(&queue_url)
        .message_body("not a log message")
        .send()
        .await?;
    let messages = receive_all(&moto, &queue_url, 3).await?;
    ensure!(messages.len() == 3, "{messages:?}");
    let garbage: Vec<String> = messages
        .iter()
        .filter(|(_, body)| body == "not a log message")
        .map(|(id, _)| id.clone())
        .collect();
    let again = log_store(&storage, &messages).await?;
    ensure!(
        again == garbage,
        "asked to redeliver {again:?}, not {garbage:?}"
    );
    ensure!(read(&*storage, &node, &out).await? == b"step 1\nstep 2\nstep 3\nstep 4\n");

    // The rewrite is marked: the next piece of that file is refused at once, not queued, so the
    // shipper stops sending it; the other file is queued as before.
    let next = send(&ingestor, &node, &[(&out, 28, b"step 5\n")]).await?;
    ensure!(
        matches!(next.as_slice(), [PieceOutcome::Refused { .. }]),
        "{next:?}"
    );
    let other = send(&ingestor, &node, &[(&err, 14, b"warn c\n")]).await?;
    ensure!(other == [PieceOutcome::Queued { end: 21 }], "{other:?}");
    ensure!(
        receive_all(&moto, &queue_url, 1).await?.len() == 1,
        "not one request queued"
    );

    // A rewrite of stored bytes is refused at once too, and nothing of it queued.
    let rewritten = send(&ingestor, &node, &[(&err, 0, b"WARN a\n")]).await?;
    ensure!(
        matches!(rewritten.as_slice(), [PieceOutcome::Refused { reason }] if reason.contains("bytes 0..")),
        "{rewritten:?}"
    );
    ensure!(
        receive_all(&moto, &queue_url, 0).await?.is_empty(),
        "a rewrite was queued"
    );
    Ok(())
}

/// A node's batch past the part size is unpacked and stored in parts, in the order sent, so a
/// batch of compressible output is never held unpacked whole; a message that does not unpack is
/// asked for again alone.
async fn a_nodes_batch_is_stored_in_parts_in_the_order_sent(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let node = log_file("worker-p-01000000-2.out")?.node();
    let out = LogFileName::new("worker-p-01000000-2.out")?;
    let lines = ["one\n", "two\n", "three\n", "four\n", "five\n"];
    let mut offset = 0;
    let mut bodies = Vec::new();
    for (sent, line) in lines.iter().enumerate() {
        let piece = ReadPiece {
            file: out.clone(),
            offset,
            bytes: line.as_bytes(),
        };
        offset += line.len() as u64;
        bodies.push(QueuedPieces::new(node.clone(), 1_000 + sent as u64, &[piece]).encode()?);
    }
    // Not gzip where the pieces should be: unreadable only once unpacked.
    let mut broken: serde_json::Value = serde_json::from_str(&bodies[0])?;
    broken["pieces"] = "bm90IGd6aXA=".into();
    let broken = broken.to_string();
    let ids = ["a", "b", "c", "d", "e", "broken"];
    // Received out of order, as a standard queue may deliver them.
    let order = [4, 1, 5, 0, 3, 2];
    let received: Vec<Received<'_>> = order
        .iter()
        .map(|&at| Received {
            id: ids[at],
            body: bodies.get(at).map_or(broken.as_str(), String::as_str),
        })
        .collect();
    let limits = DrainLimits {
        nodes_at_once: 1,
        node_part_bytes: 8,
    };
    let recorder = RecordsRequests::new(Arc::clone(&storage));
    let drained = store_batch(&recorder, &received, limits).await;
    ensure!(drained.redeliver == ["broken"], "{drained:?}");
    // Parts of 8 bytes or more: three stores, each one write of the node's index (its bytes
    // inline in it).
    let index = node.index_key()?;
    let puts = recorder.puts();
    ensure!(
        puts.len() == 3 && puts.iter().all(|key| *key == index.as_str()),
        "{puts:?}"
    );
    ensure!(drained.stores == 3, "{drained:?}");
    ensure!(read(&*storage, &node, &out).await? == lines.concat().as_bytes());
    Ok(())
}

/// With the log queue in shards, each node's requests all go to one shard's queue, the nodes
/// spread over every shard, and each shard's batches, stored on their own, store every node's
/// bytes exactly.
async fn each_nodes_requests_go_to_one_shard(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let Some(moto) = Moto::start("each_nodes_requests_go_to_one_shard").await? else {
        return Ok(());
    };
    let mut urls = Vec::new();
    for shard in 0..3 {
        urls.push(
            moto.create_queue(&format!("afterglow-logs-{shard}"))
                .await?,
        );
    }
    let shards = QueueShards::parse(&urls.join(","))?;
    let ingestor = Ingestor::new(
        Arc::clone(&storage),
        IngestAccess::Open,
        IngestLimits::default(),
    )
    .with_log_queue(Arc::new(SqsLogQueue::new(moto.sqs(), shards)));
    let out = LogFileName::new("worker-s-01000000-1.out")?;
    let nodes: Vec<NodeLogs> = (0..12_u8)
        .map(|node| {
            Ok(NodeLogs {
                cluster: ClusterName::new("logs")?,
                session: SessionName::new(super::SESSION)?,
                node_id: NodeId::new(&format!("{node:02x}").repeat(28))?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    for node in &nodes {
        let line = format!("node {}\n", node.node_id);
        send(&ingestor, node, &[(&out, 0, line.as_bytes())]).await?;
        send(&ingestor, node, &[(&out, line.len() as u64, b"done\n")]).await?;
    }

    let mut shard_of_node = std::collections::BTreeMap::new();
    for (shard, url) in urls.iter().enumerate() {
        // How many to wait for: each node of the shard sent two.
        let expected = 2 * nodes
            .iter()
            .filter(|node| shard_of(&node.prefix(), urls.len()) == shard)
            .count();
        ensure!(expected > 0, "no node on shard {shard}");
        let messages = receive_all(&moto, url, expected).await?;
        ensure!(
            messages.len() == expected,
            "shard {shard} holds {} requests, not {expected}",
            messages.len()
        );
        for (_, body) in &messages {
            let node = QueuedPieces::decode(body)?.node.node_id.to_string();
            let first = *shard_of_node.entry(node.clone()).or_insert(shard);
            ensure!(
                first == shard,
                "node {node} queued on shards {first} and {shard}"
            );
        }
        let again = log_store(&storage, &messages).await?;
        ensure!(again.is_empty(), "asked to redeliver {again:?}");
    }
    ensure!(shard_of_node.len() == nodes.len(), "{shard_of_node:?}");
    for node in &nodes {
        let stored = read(&*storage, node, &out).await?;
        ensure!(
            stored == format!("node {}\ndone\n", node.node_id).as_bytes(),
            "{}: {:?}",
            node.node_id,
            String::from_utf8_lossy(&stored)
        );
    }
    Ok(())
}

afterglow_tests::for_each_backend!(
    each_nodes_requests_go_to_one_shard,
    requests_are_queued_and_stored_a_batch_at_a_time,
    a_nodes_batch_is_stored_in_parts_in_the_order_sent,
);
