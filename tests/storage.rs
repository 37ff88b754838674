//! The storage conformance suite: every backend keeps the `Storage` contract. Each test runs
//! against a local directory and, with `AFTERGLOW_TEST_S3=1`, a real S3-protocol server.

use std::sync::Arc;

use anyhow::ensure;
use bytes::Bytes;
use futures_util::{StreamExt as _, TryStreamExt as _};
use shared::storage::{ObjectKey, PutMode, Storage, StorageError};

fn key(text: &str) -> anyhow::Result<ObjectKey> {
    Ok(ObjectKey::new(text)?)
}

async fn put_then_get_returns_the_same_bytes(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let body: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let object = key("raw/c/2026/11/22/06/a.ndjson.gz")?;
    let etag = storage
        .put(&object, Bytes::from(body.clone()), PutMode::Overwrite)
        .await?;
    let stored = storage.get(&object).await?;
    ensure!(stored.body == body, "bytes differ after a round trip");
    ensure!(
        stored.etag == etag,
        "get's tag {:?} differs from put's {:?}",
        stored.etag,
        etag
    );
    Ok(())
}

async fn get_of_a_missing_key_is_not_found(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    match storage.get(&key("nothing/here")?).await {
        Err(StorageError::NotFound { key }) => {
            ensure!(key.as_str() == "nothing/here");
            Ok(())
        }
        other => anyhow::bail!("expected NotFound, got {other:?}"),
    }
}

async fn create_refuses_an_existing_object(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let object = key("manifests/m.json")?;
    storage
        .put(&object, Bytes::from_static(b"first"), PutMode::Create)
        .await?;
    let second = storage
        .put(&object, Bytes::from_static(b"second"), PutMode::Create)
        .await;
    ensure!(
        matches!(second, Err(StorageError::Precondition { .. })),
        "expected Precondition, got {second:?}"
    );
    ensure!(
        storage.get(&object).await?.body == "first",
        "the loser overwrote the object"
    );
    Ok(())
}

async fn update_needs_the_current_tag(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let object = key("manifests/u.json")?;
    let first = storage
        .put(&object, Bytes::from_static(b"v1"), PutMode::Create)
        .await?;
    let second = storage
        .put(
            &object,
            Bytes::from_static(b"v2"),
            PutMode::Update(first.clone()),
        )
        .await?;
    ensure!(first != second, "a new version must get a new tag");
    let stale = storage
        .put(&object, Bytes::from_static(b"v3"), PutMode::Update(first))
        .await;
    ensure!(
        matches!(stale, Err(StorageError::Precondition { .. })),
        "expected Precondition for a stale tag, got {stale:?}"
    );
    let stored = storage.get(&object).await?;
    ensure!(stored.body == "v2" && stored.etag == second);
    Ok(())
}

async fn update_of_a_missing_object_is_a_precondition_failure(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let object = key("manifests/gone.json")?;
    let etag = storage
        .put(&object, Bytes::from_static(b"v1"), PutMode::Create)
        .await?;
    storage.delete(&object).await?;
    let result = storage
        .put(&object, Bytes::from_static(b"v2"), PutMode::Update(etag))
        .await;
    ensure!(
        matches!(result, Err(StorageError::Precondition { .. })),
        "expected Precondition, got {result:?}"
    );
    Ok(())
}

async fn racing_updates_from_one_version_let_exactly_one_win(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let object = key("manifests/race.json")?;
    let base = storage
        .put(&object, Bytes::from_static(b"base"), PutMode::Create)
        .await?;
    let mut racers = Vec::new();
    for writer in 0..8 {
        let storage = Arc::clone(&storage);
        let object = object.clone();
        let base = base.clone();
        racers.push(tokio::spawn(async move {
            storage
                .put(
                    &object,
                    Bytes::from(format!("writer {writer}")),
                    PutMode::Update(base),
                )
                .await
        }));
    }
    let mut winners = Vec::new();
    for (writer, racer) in racers.into_iter().enumerate() {
        match racer.await? {
            Ok(_) => winners.push(writer),
            Err(StorageError::Precondition { .. }) => {}
            Err(other) => return Err(other.into()),
        }
    }
    ensure!(
        winners.len() == 1,
        "expected exactly one winner, got {winners:?}"
    );
    let stored = storage.get(&object).await?;
    ensure!(stored.body == format!("writer {}", winners[0]));
    Ok(())
}

async fn list_returns_keys_under_a_prefix_in_order(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    for name in [
        "raw/b/2",
        "raw/a/1",
        "raw/a/3",
        "raw/ab/x",
        "tables/t/1",
        "rawer/z",
    ] {
        storage
            .put(
                &key(name)?,
                Bytes::from(name.to_owned()),
                PutMode::Overwrite,
            )
            .await?;
    }
    let listed = |prefix: &'static str| {
        let storage = Arc::clone(&storage);
        async move {
            let metas = storage.list(prefix).await?;
            anyhow::Ok(
                metas
                    .into_iter()
                    .map(|meta| (meta.key.to_string(), meta.size))
                    .collect::<Vec<_>>(),
            )
        }
    };
    ensure!(
        listed("raw/").await?
            == [
                ("raw/a/1".to_owned(), 7),
                ("raw/a/3".to_owned(), 7),
                ("raw/ab/x".to_owned(), 8),
                ("raw/b/2".to_owned(), 7)
            ],
        "raw/ listing: {:?}",
        listed("raw/").await?
    );
    let partial = listed("raw/a").await?;
    ensure!(
        partial.len() == 3,
        "raw/a should match a/ and ab/: {partial:?}"
    );
    ensure!(listed("nothing/").await?.is_empty());
    Ok(())
}

async fn delete_removes_and_is_idempotent(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let object = key("tables/old.parquet")?;
    storage
        .put(&object, Bytes::from_static(b"x"), PutMode::Overwrite)
        .await?;
    storage.delete(&object).await?;
    ensure!(matches!(
        storage.get(&object).await,
        Err(StorageError::NotFound { .. })
    ));
    storage.delete(&object).await?;
    ensure!(storage.list("tables/").await?.is_empty());
    Ok(())
}

/// More keys than one batch takes, some of them never written: every written one is gone, the
/// missing ones are no error, and objects under other keys stay.
async fn delete_all_removes_every_key_past_one_batch(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let written: Vec<ObjectKey> = (0..shared::storage::MAX_KEYS_PER_DELETE + 5)
        .map(|n| key(&format!("logs/segments/{n:05}")))
        .collect::<anyhow::Result<_>>()?;
    futures_util::stream::iter(&written)
        .map(|object| {
            let storage = Arc::clone(&storage);
            async move {
                storage
                    .put(object, Bytes::from_static(b"x"), PutMode::Overwrite)
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let kept = key("logs/index")?;
    storage
        .put(&kept, Bytes::from_static(b"i"), PutMode::Overwrite)
        .await?;
    let mut asked = written.clone();
    asked.insert(3, key("logs/segments/never-written")?);
    storage.delete_all(&asked).await?;
    let left = storage.list("logs/").await?;
    ensure!(
        left.iter().map(|meta| &meta.key).eq([&kept]),
        "{} objects left under logs/, the first {:?}",
        left.len(),
        left.first().map(|meta| &meta.key)
    );
    storage.delete_all(&asked).await?;
    storage.delete_all(&[]).await?;
    Ok(())
}

/// A read that takes at most so many bytes: an object of that size is read whole, a larger
/// one is refused with its size, and a missing one is not found.
async fn get_within_refuses_a_larger_object(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let object = key("logs/index")?;
    storage
        .put(&object, Bytes::from(vec![b'i'; 1000]), PutMode::Overwrite)
        .await?;
    let whole = storage.get_within(&object, 1000).await?;
    ensure!(whole.body.len() == 1000, "{} bytes read", whole.body.len());
    let refused = storage.get_within(&object, 999).await;
    ensure!(
        matches!(
            refused,
            Err(StorageError::TooLarge {
                bytes: 1000,
                limit: 999,
                ..
            })
        ),
        "expected TooLarge, got {refused:?}"
    );
    let missing = storage.get_within(&key("logs/none")?, 999).await;
    ensure!(
        matches!(missing, Err(StorageError::NotFound { .. })),
        "expected NotFound, got {missing:?}"
    );
    Ok(())
}

async fn overwrite_replaces_atomically(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let object = key("state/current")?;
    let big_a = vec![b'a'; 2_000_000];
    let big_b = vec![b'b'; 1_000_000];
    storage
        .put(&object, Bytes::from(big_a.clone()), PutMode::Overwrite)
        .await?;
    let writer = {
        let storage = Arc::clone(&storage);
        let object = object.clone();
        tokio::spawn(async move {
            storage
                .put(&object, Bytes::from(big_b), PutMode::Overwrite)
                .await
        })
    };
    // Whatever a reader sees while the write runs is one whole version.
    for _ in 0..10 {
        let seen = storage.get(&object).await?.body;
        ensure!(
            (seen.len() == 2_000_000 && seen.iter().all(|&b| b == b'a'))
                || (seen.len() == 1_000_000 && seen.iter().all(|&b| b == b'b')),
            "a reader saw a partial object of {} bytes",
            seen.len()
        );
    }
    writer.await??;
    ensure!(storage.get(&object).await?.body.len() == 1_000_000);
    Ok(())
}

/// A file put from disk is stored whole, with the bytes counted and the tag a get returns; the
/// object outlives the file's removal (a local store links the file), and `Create` refuses an
/// existing object, leaving the object and the file's bytes as they were.
async fn put_file_stores_the_file_and_keeps_the_contract(
    storage: Arc<dyn Storage>,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("delta.parquet");
    let body: Vec<u8> = (0..=250u8).cycle().take(3_000_000).collect();
    std::fs::write(&path, &body)?;
    let object = key("tables/task_attempts/cluster=c/session=s/delta-1.parquet")?;
    let (etag, bytes) = storage.put_file(&object, &path, PutMode::Create).await?;
    ensure!(bytes == body.len() as u64, "{bytes} bytes counted");
    std::fs::remove_file(&path)?;
    let stored = storage.get(&object).await?;
    ensure!(stored.body == body, "bytes differ after a round trip");
    ensure!(stored.etag == etag, "get's tag differs from put_file's");

    let other = dir.path().join("other.parquet");
    std::fs::write(&other, b"another version")?;
    let second = storage.put_file(&object, &other, PutMode::Create).await;
    ensure!(
        matches!(second, Err(StorageError::Precondition { .. })),
        "expected Precondition, got {second:?}"
    );
    ensure!(
        storage.get(&object).await?.body == body,
        "the loser overwrote the object"
    );
    ensure!(
        std::fs::read(&other)? == b"another version",
        "the loser's file changed"
    );
    Ok(())
}

/// A range read returns exactly those bytes (an object's tail, its middle, nothing), and
/// refuses a range past the end or of a missing object instead of answering short.
async fn get_range_reads_only_the_range(storage: Arc<dyn Storage>) -> anyhow::Result<()> {
    let body: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    let object = key("tables/task_attempts/cluster=c/session=s/base-1.parquet")?;
    storage
        .put(&object, Bytes::from(body.clone()), PutMode::Overwrite)
        .await?;
    for range in [199_992..200_000, 1_000..70_000, 0..1, 5..5] {
        let read = storage.get_range(&object, range.clone()).await?;
        ensure!(
            read[..] == body[range.start as usize..range.end as usize],
            "bytes {range:?} differ ({} read)",
            read.len()
        );
    }
    for range in [199_990..200_001, 300_000..300_008] {
        let read = storage.get_range(&object, range.clone()).await;
        ensure!(
            matches!(read, Err(StorageError::Backend { .. })),
            "bytes {range:?} of 200000: expected a refusal, got {read:?}"
        );
    }
    let missing = storage.get_range(&key("nothing/here")?, 0..8).await;
    ensure!(
        matches!(missing, Err(StorageError::NotFound { .. })),
        "expected NotFound, got {missing:?}"
    );
    Ok(())
}

afterglow_tests::for_each_backend!(
    get_range_reads_only_the_range,
    put_then_get_returns_the_same_bytes,
    get_of_a_missing_key_is_not_found,
    create_refuses_an_existing_object,
    update_needs_the_current_tag,
    update_of_a_missing_object_is_a_precondition_failure,
    racing_updates_from_one_version_let_exactly_one_win,
    list_returns_keys_under_a_prefix_in_order,
    delete_removes_and_is_idempotent,
    delete_all_removes_every_key_past_one_batch,
    get_within_refuses_a_larger_object,
    overwrite_replaces_atomically,
    put_file_stores_the_file_and_keeps_the_contract,
);

/// An S3 endpoint that accepts connections and never answers (a stalled load balancer, a
/// half-open connection): every call fails after the stall timeout and the SDK's retries,
/// instead of hanging compaction or `serve`'s queue forever. Without a timeout the call below
/// never returns (the outer bound of 60 s fails the test).
#[tokio::test]
async fn a_stalled_s3_endpoint_fails_calls_instead_of_hanging() -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    let storage = shared::storage::S3Storage::connect(shared::storage::S3Settings {
        bucket: "afterglow-test".into(),
        prefix: String::new(),
        endpoint_url: Some(endpoint),
        force_path_style: true,
        operation_timeout: None,
        stall_timeout: std::time::Duration::from_millis(300),
    })
    .await;
    let manifest = key("tables/manifests/cluster=c/session=s.json")?;
    let call = storage.get(&manifest);
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(60), call).await;
    held.abort();
    match outcome {
        Err(_) => anyhow::bail!("the call to a stalled endpoint was still waiting after 60 s"),
        Ok(Ok(_)) => anyhow::bail!("a stalled endpoint returned an object"),
        Ok(Err(err)) => {
            ensure!(
                matches!(err, shared::storage::StorageError::Backend { .. }),
                "unexpected error: {err}"
            );
            Ok(())
        }
    }
}

/// An S3 endpoint answering every request with `status` and S3's error `code`, as S3 answers a
/// conditional write it refuses; returns its URL.
async fn s3_refusing_with(status: u16, code: &'static str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let endpoint = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The whole request (headers, then Content-Length bytes of body) before answering,
                // so the client sees an answer, not a connection cut while it was sending.
                let mut read = Vec::new();
                let mut buffer = [0u8; 8192];
                loop {
                    let Ok(n) = socket.read(&mut buffer).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    read.extend_from_slice(&buffer[..n]);
                    let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&read[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length:"))
                        .and_then(|value| value.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if read.len() >= end + 4 + length {
                        break;
                    }
                }
                let body = format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
                     <Message>refused by the test</Message><RequestId>1</RequestId></Error>"
                );
                let answer = format!(
                    "HTTP/1.1 {status} Refused\r\ncontent-type: application/xml\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    Ok(endpoint)
}

/// S3's two refusals of a conditional write are told apart: `412 PreconditionFailed` is a lost
/// race (the version moved on), `409 ConditionalRequestConflict` is another write still in flight,
/// which may be the caller's own first attempt and may still land, so never a lost race.
#[tokio::test]
async fn s3_conflicts_are_not_taken_for_lost_races() -> anyhow::Result<()> {
    if !afterglow_tests::s3_enabled() {
        eprintln!("skipping: set AFTERGLOW_TEST_S3=1 (scripts/test does) for AWS credentials");
        return Ok(());
    }
    let manifest = key("tables/manifests/cluster=c/session=s.json")?;
    for (status, code, create) in [
        (409, "ConditionalRequestConflict", false),
        (409, "ConditionalRequestConflict", true),
        (412, "PreconditionFailed", false),
        (412, "PreconditionFailed", true),
    ] {
        let storage = shared::storage::S3Storage::connect(shared::storage::S3Settings {
            bucket: "afterglow-test".into(),
            prefix: String::new(),
            endpoint_url: Some(s3_refusing_with(status, code).await?),
            force_path_style: true,
            operation_timeout: Some(std::time::Duration::from_secs(20)),
            stall_timeout: std::time::Duration::from_secs(5),
        })
        .await;
        let mode = if create {
            PutMode::Create
        } else {
            PutMode::Update(shared::storage::ETag::new("\"v1\""))
        };
        let outcome = storage
            .put(&manifest, Bytes::from_static(b"{}"), mode)
            .await;
        let told = match (&outcome, status) {
            (Err(StorageError::Conflict { key }), 409)
            | (Err(StorageError::Precondition { key }), 412) => key == &manifest,
            _ => false,
        };
        ensure!(
            told,
            "a {status} {code} (create: {create}) became {outcome:?}"
        );
    }
    Ok(())
}

/// The bounded file cache on SeaweedFS (a backend without local paths, so copies are made):
/// the least recently used copy goes first, a copy asked for again counts as new, and copies a
/// caller still holds are never deleted under it, even over the limit.
#[tokio::test]
async fn the_file_cache_evicts_the_least_recently_used_unpinned_copies() -> anyhow::Result<()> {
    use shared::storage::FileCache;

    let Some(storage) = afterglow_tests::s3_storage("file cache").await else {
        return Ok(());
    };
    let storage: Arc<dyn Storage> = Arc::new(storage);
    let keys: Vec<ObjectKey> = ["a", "b", "c", "d"]
        .iter()
        .map(|name| key(&format!("tables/t/{name}.parquet")))
        .collect::<Result<_, _>>()?;
    for key in &keys {
        storage
            .put(key, Bytes::from(vec![7_u8; 100]), PutMode::Overwrite)
            .await?;
    }
    let dir = tempfile::tempdir()?;
    let cache = FileCache::bounded(Arc::clone(&storage), dir.path().to_path_buf(), 2, Some(250));
    let [a, b, c, d] = keys.as_slice() else {
        anyhow::bail!("four keys");
    };
    let copy = |key: &ObjectKey| dir.path().join(key.as_str().replace('/', "~"));
    for key in [a, b, c] {
        drop(cache.files(std::slice::from_ref(key)).await?);
    }
    ensure!(!copy(a).exists(), "the oldest copy was kept over the limit");
    ensure!(copy(b).exists() && copy(c).exists());
    ensure!(cache.held_bytes() == 200, "held {}", cache.held_bytes());

    // Asked for again, b is newer than c: c goes when d comes.
    drop(cache.files(std::slice::from_ref(b)).await?);
    drop(cache.files(std::slice::from_ref(d)).await?);
    ensure!(!copy(c).exists() && copy(b).exists() && copy(d).exists());

    // Held by a caller, b and d survive fetches that push the cache over its limit.
    let held = cache.files(&[b.clone(), d.clone()]).await?;
    let more = cache.files(&[a.clone(), c.clone()]).await?;
    for path in held.files().iter().chain(more.files()) {
        ensure!(path.exists(), "{} was deleted while held", path.display());
    }
    ensure!(cache.held_bytes() == 400, "held {}", cache.held_bytes());
    drop((held, more));
    drop(cache.files(std::slice::from_ref(a)).await?);
    ensure!(
        cache.held_bytes() <= 250,
        "held {} once released",
        cache.held_bytes()
    );
    ensure!(copy(a).exists(), "the copy just asked for was evicted");
    Ok(())
}
