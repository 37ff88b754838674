//! The names a shipped log piece carries, each one segment of the key the store keeps it under
//! (`shared::keys`): a Ray session's name, a node's id and a log file's name. The shipper checks
//! them as the store will, so that a name the store cannot keep is skipped on the node, not
//! refused piece by piece.

/// Defines a validated name that becomes one key segment.
macro_rules! segment_name {
    ($(#[$doc:meta])* $name:ident, $error:ident, $what:literal, $rule:literal, $valid:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        #[doc = concat!("A value that is not a valid [`", stringify!($name), "`].")]
        #[derive(Debug, thiserror::Error)]
        #[error("invalid {what} {0:?}: {rule}", what = $what, rule = $rule)]
        pub struct $error(String);

        impl $name {
            #[doc = concat!("Checks the value: ", $rule, ".")]
            pub fn new(name: &str) -> Result<Self, $error> {
                let valid: fn(&str) -> bool = $valid;
                if valid(name) {
                    Ok(Self(name.to_owned()))
                } else {
                    Err($error(name.to_owned()))
                }
            }

            /// The name.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

segment_name!(
    /// A Ray session's name, such as `session_2026-11-22_06-14-46_050039_15318` (Ray's form; the
    /// rule is looser, as it always was for the tables, so that every stored session parses).
    SessionName,
    InvalidSessionName,
    "session name",
    "1-128 of A-Z a-z 0-9 - _ ., not starting with '.'",
    |name| {
        (1..=128).contains(&name.len())
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte))
    }
);

segment_name!(
    /// A Ray node id in hex (56 lower-case digits), as Ray names it in its files and logs.
    NodeId,
    InvalidNodeId,
    "node id",
    "56 lower-case hex digits",
    |id| id.len() == 56 && id.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
);

segment_name!(
    /// The name of a file in a Ray session's `logs/` folder, such as
    /// `worker-{worker_id}-{job_id}-{pid}.out`.
    LogFileName,
    InvalidLogFileName,
    "log file name",
    "1-255 of A-Z a-z 0-9 - _ . =, not starting with '.'",
    |name| {
        (1..=255).contains(&name.len())
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || b"-_.=".contains(&byte))
    }
);
