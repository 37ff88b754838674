//! Secrets: the ingest secret each cluster's export-URL token is derived from ([`ingest`]) and
//! the optional query bearer token. Both are compared in constant time and never appear in
//! `Debug` output or logs.

pub mod ingest;

use subtle::ConstantTimeEq;

/// A shared secret sent as it is: the query API's bearer token.
#[derive(Clone)]
pub struct AccessToken(Box<str>);

/// A token that is too short, or has characters that would need escaping in a URL.
#[derive(Debug, thiserror::Error)]
pub enum InvalidToken {
    /// Guessable tokens are refused outright.
    #[error("must be at least {min} characters long (got {len})")]
    TooShort {
        /// Minimum length.
        min: usize,
        /// Length given.
        len: usize,
    },
    /// The token goes verbatim into Ray's export URL.
    #[error("may only contain A-Z a-z 0-9 - _ . ~ (it goes into a URL unescaped)")]
    BadCharacter,
}

impl AccessToken {
    /// Shortest accepted token.
    pub const MIN_LEN: usize = 16;

    /// Checks and wraps a secret.
    pub fn new(secret: &str) -> Result<Self, InvalidToken> {
        if secret.len() < Self::MIN_LEN {
            return Err(InvalidToken::TooShort {
                min: Self::MIN_LEN,
                len: secret.len(),
            });
        }
        if !secret
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte))
        {
            return Err(InvalidToken::BadCharacter);
        }
        Ok(Self(secret.into()))
    }

    /// The secret itself, to send it (`afterglow proxy` adds it to requests). Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True if `presented` is the secret. The comparison time does not depend on where the two
    /// differ (only on their lengths).
    pub fn matches(&self, presented: &str) -> bool {
        self.0.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

/// Why the query API's bearer check refused a request.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BearerRefusal {
    /// No `Authorization: Bearer …` header.
    #[error("this API requires `Authorization: Bearer <AFTERGLOW_QUERY_TOKEN>`")]
    Missing,
    /// A bearer token that is not the configured one.
    #[error("wrong bearer token")]
    Wrong,
}

/// Checks a request's `Authorization` header against the query token; with no token
/// configured (loopback `serve`, or IAM in front on AWS) every request passes.
pub fn check_bearer(
    token: Option<&AccessToken>,
    authorization: Option<&str>,
) -> Result<(), BearerRefusal> {
    let Some(token) = token else {
        return Ok(());
    };
    match authorization.and_then(|value| value.strip_prefix("Bearer ")) {
        None => Err(BearerRefusal::Missing),
        Some(presented) if token.matches(presented) => Ok(()),
        Some(_) => Err(BearerRefusal::Wrong),
    }
}

impl std::fmt::Debug for AccessToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessToken(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_only_the_exact_secret() -> Result<(), InvalidToken> {
        let token = AccessToken::new("s3cret-token-0123456789")?;
        assert!(token.matches("s3cret-token-0123456789"));
        assert!(!token.matches("s3cret-token-012345678"));
        assert!(!token.matches("s3cret-token-01234567890"));
        assert!(!token.matches("S3cret-token-0123456789"));
        assert!(!token.matches(""));
        Ok(())
    }

    #[test]
    fn refuses_short_or_url_unsafe_secrets() {
        assert!(matches!(
            AccessToken::new("short"),
            Err(InvalidToken::TooShort { .. })
        ));
        assert!(matches!(
            AccessToken::new("has spaces in it, sadly"),
            Err(InvalidToken::BadCharacter)
        ));
        assert!(matches!(
            AccessToken::new("ampersand&is&bad&here"),
            Err(InvalidToken::BadCharacter)
        ));
    }

    #[test]
    fn a_bearer_header_must_carry_the_token() -> Result<(), InvalidToken> {
        let token = AccessToken::new("query-token-0123456789")?;
        assert_eq!(check_bearer(None, None), Ok(()));
        assert_eq!(
            check_bearer(Some(&token), None),
            Err(BearerRefusal::Missing)
        );
        assert_eq!(
            check_bearer(Some(&token), Some("Basic query-token-0123456789")),
            Err(BearerRefusal::Missing)
        );
        assert_eq!(
            check_bearer(Some(&token), Some("Bearer query-token-012345678")),
            Err(BearerRefusal::Wrong)
        );
        assert_eq!(
            check_bearer(Some(&token), Some("Bearer query-token-0123456789")),
            Ok(())
        );
        Ok(())
    }

    #[test]
    fn debug_output_never_shows_the_secret() -> Result<(), InvalidToken> {
        let token = AccessToken::new("s3cret-token-0123456789")?;
        assert!(!format!("{token:?}").contains("s3cret"));
        Ok(())
    }
}
