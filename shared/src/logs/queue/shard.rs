//! The log queue's shards: which queue a node's requests go to.
//!
//! A batch of Lambda's SQS source closes at 6 MB of messages. Once a fleet's busy nodes send
//! more than that in a batch window, one queue's batches close early and each holds a slice of
//! every node's minute, so every node's index is written once per batch instead of once a
//! minute. Sharding by node keeps a batch's nodes few: each node's requests always go to the
//! same queue, so a shard's batches hold whole minutes of its nodes alone, and batches of
//! different shards hold different nodes (while the number of shards stays the same).

use crate::keys::NodeLogs;

/// The queues of the log queue's shards, in order (at least one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueShards {
    urls: Vec<String>,
}

/// A list of queue URLs that names no queue, or an empty one.
#[derive(Debug, thiserror::Error)]
#[error("expected one queue URL, or several separated by commas, none of them empty")]
pub struct NoQueue;

impl QueueShards {
    /// The shards of `text`: queue URLs separated by commas, in the order the template lists
    /// them (every ingest instance must choose the same queue for a node).
    pub fn parse(text: &str) -> Result<Self, NoQueue> {
        let urls: Vec<String> = text.split(',').map(|url| url.trim().to_owned()).collect();
        if urls.iter().any(String::is_empty) {
            return Err(NoQueue);
        }
        Ok(Self { urls })
    }

    /// The one queue at `url`.
    pub fn one(url: String) -> Self {
        Self { urls: vec![url] }
    }

    /// The queue `node`'s requests go to.
    pub fn queue_of(&self, node: &NodeLogs) -> &str {
        &self.urls[shard_of(&node.prefix(), self.urls.len())]
    }

    /// Every shard's queue, in order.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }
}

/// Which of `shards` (at least one) the node whose log prefix is `prefix` belongs to.
///
/// FNV-1a, written out: its value must not change with the Rust release or the platform the
/// binary was built for, since ingest instances of two builds may run at once during a deploy.
pub fn shard_of(prefix: &str, shards: usize) -> usize {
    (fnv1a(prefix) % shards.max(1) as u64) as usize
}

/// The 64-bit FNV-1a hash of `text`.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_with_an_empty_url_are_refused() {
        for text in ["", "a,", ",a", "a,,b", " "] {
            assert!(QueueShards::parse(text).is_err(), "{text:?} was accepted");
        }
        let shards = QueueShards::parse("https://q/1, https://q/2").expect("two queues");
        assert_eq!(shards.urls(), ["https://q/1", "https://q/2"]);
    }

    /// FNV-1a's published test vectors: a change of the function would move nodes between
    /// shards while two builds run.
    #[test]
    fn the_hash_is_fnv_1a() {
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a("foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(
            shard_of("foobar", 4),
            (0x8594_4171_f739_67e8_u64 % 4) as usize
        );
    }

    /// Ray's node ids are random: a thousand nodes fall into four shards near evenly.
    #[test]
    fn nodes_spread_over_the_shards() {
        let mut counts = [0_usize; 4];
        for node in 0..1000_u64 {
            let id = format!("{:056x}", node.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            counts[shard_of(&format!("logs/c/s/{id}/"), 4)] += 1;
        }
        assert!(
            counts.iter().all(|&count| (200..=300).contains(&count)),
            "{counts:?}"
        );
    }
}
