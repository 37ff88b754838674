//! Quiet checks: a session as one commit left it ([`QuietCheck`]), looked at again once it may
//! have gone quiet, and tidied ([`crate::compact::fold`]) only if no commit came since. A check
//! travels as a queue message on AWS ([`super::check_queue`]) and waits on a timer in `serve`
//! ([`super::queue`]); the compact function runs the checks of a batch of messages with
//! [`Compactor::tidy_messages`].

use serde::{Deserialize, Serialize};

use super::batch::BatchLimits;
use crate::compact::Compactor;
use crate::keys::{ClusterName, SessionName};

/// A session as one commit left it: a quiet check of it tidies the session only if it is still
/// at `sequence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuietCheck {
    /// The cluster.
    pub cluster: ClusterName,
    /// The session.
    pub session: SessionName,
    /// The manifest's sequence after that commit.
    pub sequence: u64,
}

/// A message that says it is a quiet check but is not a valid one.
#[derive(Debug, thiserror::Error)]
#[error("not a valid quiet check: {0}")]
pub struct InvalidCheck(String);

/// A quiet check as a queue message carries it.
#[derive(Deserialize, Serialize)]
struct Wire {
    kind: String,
    cluster: String,
    session: String,
    sequence: u64,
}

impl QuietCheck {
    /// The marker that tells a quiet check from an S3 notification in the compact queue.
    const KIND: &'static str = "afterglow.quiet_check";

    /// The check as the body of a queue message.
    pub fn to_message(&self) -> String {
        let wire = Wire {
            kind: Self::KIND.to_owned(),
            cluster: self.cluster.to_string(),
            session: self.session.to_string(),
            sequence: self.sequence,
        };
        // Strings and a number: serializing cannot fail.
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// The check a message body holds; `None` when the body is something else (an S3
    /// notification), an error when it says it is a check but is not a valid one.
    pub fn from_message(body: &str) -> Result<Option<Self>, InvalidCheck> {
        #[derive(Deserialize)]
        struct Tagged {
            kind: Option<String>,
        }
        let Ok(Tagged { kind }) = serde_json::from_str::<Tagged>(body) else {
            return Ok(None);
        };
        if kind.as_deref() != Some(Self::KIND) {
            return Ok(None);
        }
        let wire: Wire = serde_json::from_str(body).map_err(|err| InvalidCheck(err.to_string()))?;
        Ok(Some(Self {
            cluster: ClusterName::new(&wire.cluster)
                .map_err(|err| InvalidCheck(err.to_string()))?,
            session: SessionName::new(&wire.session)
                .map_err(|err| InvalidCheck(err.to_string()))?,
            sequence: wire.sequence,
        }))
    }
}

impl Compactor {
    /// Runs the quiet checks of a batch of queue messages (`(message id, check)`), each while
    /// the deadline allows. Returns the ids of the messages to retry (the check failed or was
    /// not reached) and the checks to queue again (sessions still holding retired files), each
    /// with the id of the message whose check asks for it.
    pub async fn tidy_messages(
        &self,
        checks: &[(String, QuietCheck)],
        limits: &BatchLimits,
    ) -> (Vec<String>, Vec<(String, QuietCheck)>) {
        let mut failed = Vec::new();
        let mut again = Vec::new();
        for (id, check) in checks {
            match self.within(limits, self.tidy_if_quiet(check)).await {
                Some(Ok(tidied)) => {
                    if tidied.again {
                        let follow_up = QuietCheck {
                            sequence: tidied.sequence,
                            ..check.clone()
                        };
                        again.push((id.clone(), follow_up));
                    }
                }
                Some(Err(err)) => {
                    tracing::warn!(message_id = %id, error = %err, "quiet check failed; it is retried");
                    failed.push(id.clone());
                }
                None => failed.push(id.clone()),
            }
        }
        (failed, again)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_reads_back_from_its_message_and_other_bodies_are_not_checks() {
        let check = QuietCheck {
            cluster: ClusterName::new("prod").expect("a valid name"),
            session: SessionName::new("session_2026-11-25_10-00-00_000000_1")
                .expect("a valid name"),
            sequence: 41,
        };
        assert_eq!(
            QuietCheck::from_message(&check.to_message()).ok(),
            Some(Some(check))
        );
        for other in [
            r#"{"Records": []}"#,
            r#"{"Event": "s3:TestEvent"}"#,
            "not json",
            r#"{"kind": "something else"}"#,
        ] {
            assert!(
                matches!(QuietCheck::from_message(other), Ok(None)),
                "{other}"
            );
        }
        for bad in [
            r#"{"kind": "afterglow.quiet_check", "cluster": "prod"}"#,
            r#"{"kind": "afterglow.quiet_check", "cluster": "../x", "session": "s", "sequence": 1}"#,
        ] {
            assert!(QuietCheck::from_message(bad).is_err(), "{bad}");
        }
    }
}
