//! The store on both backends: pieces tile a file and any range reads back, overlaps are
//! checked wherever they fall, a lost response is recognised, a re-send costs its own size, and
//! a segment an age rule removed becomes a gap.

use std::sync::Arc;

use afterglow_tests::faults::{LosesConditionalResponses, RecordsRequests};
use afterglow_tests::for_each_backend;
use anyhow::ensure;
use shared::keys::LogFileName;
use shared::logs::inline::INLINE_BYTES;
use shared::logs::read::{LogRange, list_files, read_range, read_tail};
use shared::logs::store::{MAX_BODY_BYTES, MERGE_RUN, PieceOutcome, ReadPiece, put_pieces};
use shared::storage::Storage;

use super::{ALL, log_file, put};

/// What a stored piece's outcome says: bytes newly stored and where the file continues.
fn stored(outcome: &PieceOutcome) -> anyhow::Result<(usize, u64)> {
    match outcome {
        PieceOutcome::Stored { stored, end } => Ok((*stored, *end)),
        PieceOutcome::Refused { reason } => anyhow::bail!("refused: {reason}"),
        PieceOutcome::Queued { .. } => anyhow::bail!("queued, where the store stores"),
    }
}

async fn pieces_tile_a_file_and_any_range_reads_back(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let file = log_file("worker-a-01000000-7.out")?;
    let text = b"first line\nsecond line\nthird\n";
    put(&*storage, &file, 0, &text[..11]).await?;
    put(&*storage, &file, 11, &text[11..]).await?;
    let whole = read_range(&*storage, &file, 0, None, ALL).await?;
    ensure!(whole.bytes == text && whole.complete, "{whole:?}");
    // A range across the two pieces, as a task's taskLogInfo names one.
    let middle = read_range(&*storage, &file, 6, Some(17), ALL).await?;
    ensure!(
        middle
            == LogRange {
                bytes: text[6..17].to_vec(),
                complete: true
            },
        "{middle:?}"
    );
    // Past what was shipped: the stored part, marked incomplete.
    let past = read_range(&*storage, &file, 23, Some(40), ALL).await?;
    ensure!(
        past == LogRange {
            bytes: text[23..].to_vec(),
            complete: false
        },
        "{past:?}"
    );
    let other = read_range(&*storage, &log_file("never-sent.out")?, 0, Some(5), ALL).await?;
    ensure!(other.bytes.is_empty() && !other.complete, "{other:?}");
    // A limit cuts a range short, and says so; a range that just fits is whole.
    let cut = read_range(&*storage, &file, 6, None, 5).await?;
    ensure!(
        cut == LogRange {
            bytes: text[6..11].to_vec(),
            complete: false
        },
        "{cut:?}"
    );
    let fits = read_range(&*storage, &file, 6, Some(17), 11).await?;
    ensure!(fits.bytes == text[6..17] && fits.complete, "{fits:?}");
    Ok(())
}

async fn overlaps_are_checked_wherever_they_fall_and_only_new_bytes_stored(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let file = log_file("worker-b-01000000-8.err")?;
    put(&*storage, &file, 0, b"0123456789").await?;
    // A re-send from an acknowledged offset, with what was appended since.
    ensure!(stored(&put(&*storage, &file, 0, b"0123456789abc").await?)? == (3, 13));
    ensure!(stored(&put(&*storage, &file, 0, b"0123456789abc").await?)? == (0, 13));
    // Starting inside a stored extent, and running past two of them.
    ensure!(stored(&put(&*storage, &file, 5, b"56789abcdef").await?)? == (3, 16));
    // A gap at 16..20, then bytes stored after it.
    put(&*storage, &file, 20, b"WXYZ").await?;
    // Equal, then new bytes in the gap, then a difference: the new bytes before the
    // difference are stored, nothing after it.
    ensure!(
        refusal(&put(&*storage, &file, 14, b"efGHIJwXYZ!").await?).is_some(),
        "a difference after a gap was not refused"
    );
    // The same name with other bytes (a file rewritten), the difference inside an extent and
    // not at the piece's start: refused, and nothing changes.
    let Some(at) = refusal(&put(&*storage, &file, 3, b"3456X89").await?) else {
        anyhow::bail!("a rewrite was not refused");
    };
    ensure!(at.contains("bytes 7..10"), "{at}");
    let stored_now = read_range(&*storage, &file, 0, None, ALL).await?;
    ensure!(
        stored_now.bytes == b"0123456789abcdefGHIJWXYZ" && stored_now.complete,
        "{stored_now:?}"
    );
    Ok(())
}

/// Why a piece was refused; `None` when it was stored.
fn refusal(outcome: &PieceOutcome) -> Option<String> {
    match outcome {
        PieceOutcome::Refused { reason } => Some(reason.clone()),
        PieceOutcome::Stored { .. } | PieceOutcome::Queued { .. } => None,
    }
}

async fn a_lost_response_is_recognised_not_refused(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let faulty = LosesConditionalResponses::new(Arc::clone(&storage), "logs/", 1);
    let file = log_file("raylet.out")?;
    // The index lands, the response is lost, the SDK's retry sees 412.
    let outcome = put(&faulty, &file, 0, b"raylet started\n").await?;
    ensure!(faulty.lost() == 1, "the response was not lost");
    ensure!(stored(&outcome)? == (15, 15), "{outcome:?}");
    ensure!(read_range(&*storage, &file, 0, None, ALL).await?.bytes == b"raylet started\n");
    Ok(())
}

async fn one_request_holds_many_files_and_they_list_by_name(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let node = log_file("raylet.out")?.node();
    let (raylet, rotated) = (
        LogFileName::new("raylet.out")?,
        LogFileName::new("raylet.out.1")?,
    );
    let pieces = [
        ReadPiece {
            file: raylet.clone(),
            offset: 0,
            bytes: b"one\ntwo\n",
        },
        ReadPiece {
            file: rotated.clone(),
            offset: 0,
            bytes: b"rotated\n",
        },
        ReadPiece {
            file: raylet.clone(),
            offset: 8,
            bytes: b"three\n",
        },
    ];
    let outcomes = put_pieces(&*storage, &node, &pieces).await?;
    ensure!(outcomes.len() == 3, "{outcomes:?}");
    // A few lines are carried inline: the request wrote one object, the node's index.
    let objects: Vec<String> = storage
        .list(&node.prefix())
        .await?
        .into_iter()
        .map(|meta| meta.key.as_str().to_owned())
        .collect();
    ensure!(
        objects == [node.index_key()?.as_str()],
        "one object per request: {objects:?}"
    );
    let file = node.file(raylet);
    let whole = read_range(&*storage, &file, 0, None, ALL).await?;
    ensure!(
        whole.bytes == b"one\ntwo\nthree\n" && whole.complete,
        "{whole:?}"
    );
    let tail = read_tail(&*storage, &file, 3, ALL).await?;
    ensure!(
        tail.bytes == b"one\ntwo\nthree\n" && tail.complete,
        "{tail:?}"
    );
    let names: Vec<(String, u64)> = list_files(&*storage, &node)
        .await?
        .into_iter()
        .map(|shipped| (shipped.name.to_string(), shipped.bytes))
        .collect();
    ensure!(
        names
            == [
                ("raylet.out".to_owned(), 14),
                ("raylet.out.1".to_owned(), 8)
            ],
        "{names:?}"
    );
    Ok(())
}

async fn a_large_resend_over_many_stored_pieces_costs_its_own_size(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let node = log_file("raylet.out")?.node();
    let name = LogFileName::new("worker-e-01000000-5.out")?;
    let file = node.file(name.clone());
    // 10 000 one-line pieces, shipped 1 000 to a request: a slow printer over hours, whose
    // lines compress too poorly to be carried inline for long.
    let text = afterglow_tests::noisy_lines(1_000_000, 3);
    let lines: Vec<&[u8]> = text.chunks(100).collect();
    let mut offset = 0_u64;
    for batch in lines.chunks(1_000) {
        let mut pieces = Vec::new();
        for line in batch {
            pieces.push(ReadPiece {
                file: name.clone(),
                offset,
                bytes: line,
            });
            offset += line.len() as u64;
        }
        put_pieces(&*storage, &node, &pieces).await?;
    }
    let stored_text = lines.concat();
    ensure!(
        !storage
            .list(&format!("{}segments/", node.prefix()))
            .await?
            .is_empty(),
        "every piece is inline: the re-send would read no segment"
    );
    // A shipper that lost its state sends the file again from 0, as much as a body holds.
    let mut resend = stored_text.clone();
    resend.resize(MAX_BODY_BYTES - 1_024, b'+');
    let recorder = Arc::new(RecordsRequests::new(Arc::clone(&storage)));
    let outcome = put(&*recorder, &file, 0, &resend).await?;
    ensure!(
        stored(&outcome)? == (resend.len() - stored_text.len(), resend.len() as u64),
        "{outcome:?}"
    );
    // The stored part is read back a few merged extents at a time, not a piece at a time.
    let reads = recorder.ranges().len();
    ensure!(
        reads <= 2 * MERGE_RUN,
        "{reads} ranged reads to check a re-send over 10 000 pieces"
    );
    ensure!(recorder.lists() == 0, "the store listed");
    let whole = read_range(&*recorder, &file, 0, None, ALL).await?;
    ensure!(
        whole.bytes == resend,
        "{} bytes read back",
        whole.bytes.len()
    );
    ensure!(recorder.lists() == 0, "a read listed");
    Ok(())
}

async fn a_segment_an_age_rule_removed_is_a_gap_a_resend_fills(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let file = log_file("worker-f-01000000-6.out")?;
    // Each request too large to be carried inline in the index: a segment each.
    let first = afterglow_tests::noisy_lines(3 * INLINE_BYTES, 1);
    let second = afterglow_tests::noisy_lines(3 * INLINE_BYTES, 2);
    let third = b"third\n";
    let all = [first.as_slice(), &second, third].concat();
    put(&*storage, &file, 0, &first).await?;
    put(&*storage, &file, first.len() as u64, &second).await?;
    // The age rule removes the first request's segment (ids sort by time).
    let segments = storage
        .list(&format!("{}segments/", file.node().prefix()))
        .await?;
    ensure!(segments.len() == 2, "{segments:?}");
    storage.delete(&segments[0].key).await?;
    ensure!(
        read_range(&*storage, &file, 0, None, ALL).await.is_err(),
        "a read of a removed segment answered"
    );
    // The shipper, its state lost, sends the file from 0: the gap is filled, the rest checked.
    let outcome = put(&*storage, &file, 0, &all).await?;
    let expected = (first.len() + third.len(), all.len() as u64);
    ensure!(stored(&outcome)? == expected, "{outcome:?}");
    let whole = read_range(&*storage, &file, 0, None, ALL).await?;
    ensure!(
        whole.bytes == all && whole.complete,
        "{} bytes",
        whole.bytes.len()
    );
    Ok(())
}

/// A file rewritten under the same name is refused where it first differs, and nothing of it
/// past there is stored later either: the stored file never goes on with the other file's
/// bytes.
async fn a_rewritten_file_stores_nothing_past_its_difference(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let file = log_file("worker-r-01000000-3.out")?;
    put(&*storage, &file, 0, b"one\ntwo\n").await?;
    let rewritten = put(&*storage, &file, 0, b"one\nTWO\nthree\n").await?;
    ensure!(
        refusal(&rewritten).is_some_and(|reason| reason.contains("bytes 4..")),
        "{rewritten:?}"
    );
    // The rewritten file's next bytes, sent as a shipper that lost its state would.
    let next = put(&*storage, &file, 8, b"three\n").await?;
    ensure!(
        refusal(&next).is_some(),
        "stored past the difference: {next:?}"
    );
    let resent = put(&*storage, &file, 0, b"one\n").await?;
    ensure!(stored(&resent)? == (0, 4), "{resent:?}");
    let whole = read_range(&*storage, &file, 0, None, ALL).await?;
    ensure!(whole.bytes == b"one\ntwo\n" && whole.complete, "{whole:?}");
    Ok(())
}

for_each_backend!(
    a_rewritten_file_stores_nothing_past_its_difference,
    one_request_holds_many_files_and_they_list_by_name,
    pieces_tile_a_file_and_any_range_reads_back,
    overlaps_are_checked_wherever_they_fall_and_only_new_bytes_stored,
    a_lost_response_is_recognised_not_refused,
    a_large_resend_over_many_stored_pieces_costs_its_own_size,
    a_segment_an_age_rule_removed_is_a_gap_a_resend_fills,
);
