//! Logs of the older layout (an object per shipped piece at
//! `logs/{cluster}/{session}/{node}/{file}/{offset:020}.gz`) moved into segments and the index,
//! on both backends: readable afterwards, the pieces gone, nothing stored twice, and a piece
//! that cannot be moved kept.

use std::sync::Arc;

use anyhow::{Context as _, ensure};
use shared::gzip::gzip;
use shared::keys::LogFile;
use shared::logs::migrate::{Moved, find_older_pieces, move_all};
use shared::logs::read::{list_files, read_range, read_tail};
use shared::logs::store::PieceOutcome;
use shared::storage::{ObjectKey, PutMode, Storage};

use super::{ALL, log_file, put};

/// Stores `bytes` as the older layout stored a piece of `file` from `offset`.
async fn put_older(
    storage: &dyn Storage,
    file: &LogFile,
    offset: u64,
    body: Vec<u8>,
) -> anyhow::Result<ObjectKey> {
    let key = ObjectKey::new(format!(
        "{}{}/{offset:020}.gz",
        file.node().prefix(),
        file.file
    ))?;
    storage.put(&key, body.into(), PutMode::Create).await?;
    Ok(key)
}

/// Moves every older piece in `storage`; what was moved, or the first node's error.
async fn migrate(storage: &dyn Storage) -> anyhow::Result<Moved> {
    let nodes = find_older_pieces(storage).await?;
    let mut total = Moved::default();
    for (node, moved) in move_all(storage, nodes, 4, |_, _| {}).await {
        total.add(moved.with_context(|| node.prefix())?);
    }
    Ok(total)
}

/// The keys under `logs/` of the older layout still stored: every gzip object but segments.
async fn older_keys(storage: &dyn Storage) -> anyhow::Result<Vec<String>> {
    Ok(storage
        .list("logs/")
        .await?
        .into_iter()
        .map(|object| object.key.as_str().to_owned())
        .filter(|key| key.ends_with(".gz") && !key.contains("/segments/"))
        .collect())
}

async fn older_pieces_are_moved_and_read_back_by_the_index(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let out = log_file("worker-aa-01000000-11.out")?;
    let err = log_file("worker-aa-01000000-11.err")?;
    let text = b"alpha\nbeta\ngamma\ndelta\n";
    for (offset, piece) in [(0, &text[..6]), (6, &text[6..11]), (11, &text[11..17])] {
        put_older(&*storage, &out, offset, gzip(piece)?).await?;
    }
    put_older(&*storage, &err, 0, gzip(b"oops\n")?).await?;
    // Shipped again in the current layout: the first two pieces (a move cut short after its
    // store, or a shipper that lost its state), and what the file went on with after the
    // upgrade.
    put(&*storage, &out, 0, &text[..11]).await?;
    put(&*storage, &out, 17, &text[17..]).await?;
    let before = read_range(&*storage, &out, 0, None, ALL).await?;
    ensure!(before.bytes == text[..11], "{before:?}");

    let moved = migrate(&*storage).await?;
    ensure!(moved.pieces == 4 && moved.kept.is_empty(), "{moved:?}");
    ensure!(moved.bytes == 17 + 5, "{moved:?}");
    let whole = read_range(&*storage, &out, 0, None, ALL).await?;
    ensure!(whole.bytes == text && whole.complete, "{whole:?}");
    let tail = read_tail(&*storage, &out, 2, ALL).await?;
    ensure!(tail.bytes == b"gamma\ndelta\n", "{tail:?}");
    let errors = read_range(&*storage, &err, 0, Some(5), ALL).await?;
    ensure!(errors.bytes == b"oops\n" && errors.complete, "{errors:?}");
    let files: Vec<String> = list_files(&*storage, &out.node())
        .await?
        .into_iter()
        .map(|file| file.name.as_str().to_owned())
        .collect();
    ensure!(files == [err.file.as_str(), out.file.as_str()], "{files:?}");
    ensure!(older_keys(&*storage).await?.is_empty());

    // Again: nothing left to move, and what was moved reads the same.
    ensure!(migrate(&*storage).await? == Moved::default());
    // A piece another run moved after this one listed it is not this run's to keep.
    let late = put_older(&*storage, &err, 5, gzip(b"late\n")?).await?;
    let listed = find_older_pieces(&*storage).await?;
    storage.delete(&late).await?;
    for (node, moved) in move_all(&*storage, listed, 4, |_, _| {}).await {
        let moved = moved.with_context(|| node.prefix())?;
        ensure!(moved == Moved::default(), "{moved:?}");
    }
    let again = read_range(&*storage, &out, 0, None, ALL).await?;
    ensure!(again.bytes == text, "{again:?}");
    Ok(())
}

async fn a_piece_that_differs_or_cannot_be_read_is_kept(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let rewritten = log_file("worker-bb-01000000-12.out")?;
    let damaged = log_file("worker-bb-01000000-13.out")?;
    let fine = log_file("worker-bb-01000000-14.out")?;
    put(&*storage, &rewritten, 0, b"HELLO").await?;
    let differs = put_older(&*storage, &rewritten, 0, gzip(b"hello world\n")?).await?;
    let unreadable = put_older(&*storage, &damaged, 0, b"not gzip".to_vec()).await?;
    put_older(&*storage, &fine, 0, gzip(b"fine\n")?).await?;

    let moved = migrate(&*storage).await?;
    ensure!(moved.pieces == 1 && moved.bytes == 5, "{moved:?}");
    let mut kept: Vec<&str> = moved.kept.iter().map(|(key, _)| key.as_str()).collect();
    kept.sort_unstable();
    let mut expected = [differs.as_str(), unreadable.as_str()];
    expected.sort_unstable();
    ensure!(kept == expected, "{:?}", moved.kept);
    // Kept in storage for a look, and the stored bytes are the ones shipped first.
    let mut left = older_keys(&*storage).await?;
    left.sort_unstable();
    ensure!(left == expected, "{left:?}");
    let first = read_range(&*storage, &rewritten, 0, None, ALL).await?;
    ensure!(first.bytes == b"HELLO", "{first:?}");
    // The stale piece marks nothing: the file as shipped goes on being stored.
    let next = put(&*storage, &rewritten, 5, b" again\n").await?;
    ensure!(
        matches!(next, PieceOutcome::Stored { stored: 7, .. }),
        "{next:?}"
    );
    let grown = read_range(&*storage, &rewritten, 0, None, ALL).await?;
    ensure!(grown.bytes == b"HELLO again\n", "{grown:?}");
    let other = read_range(&*storage, &fine, 0, None, ALL).await?;
    ensure!(other.bytes == b"fine\n" && other.complete, "{other:?}");
    Ok(())
}

afterglow_tests::for_each_backend!(
    older_pieces_are_moved_and_read_back_by_the_index,
    a_piece_that_differs_or_cannot_be_read_is_kept,
);
