//! Protobuf-JSON encoding rules of Ray's exported events, as serde helpers.
//!
//! Ray's aggregator agent prints events with `MessageToJson`, so every value follows the proto3
//! JSON mapping (reference §2.1): `bytes` are padded standard base64, 64-bit integers are strings,
//! timestamps are RFC 3339 with 0–9 fractional digits, enums are their names. This module turns
//! those into the forms the rest of Afterglow works with (hex IDs, integers, nanoseconds) and owns
//! no knowledge of which field uses which rule.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// Standard alphabet; padding is what Ray sends, but a missing pad costs nothing to accept.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A Ray binary ID (task, job, actor, node, worker, placement group), held as lowercase hex:
/// the form Ray's state API and dashboard print. An event's own id is an [`EventId`].
///
/// Deserializes from the base64 the wire carries. An empty string means "not set" and is read as
/// `None` by [`opt_id`]; a bare `Id` is never empty.
///
/// Shared, not owned: the merge keys maps and copies attempts by their ids many times per
/// event, and clones that allocate and copy the text would be a noticeable share of
/// compaction.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(Arc<str>);

impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl Id {
    /// Decodes Ray's base64 form. Returns `None` for the empty string (an unset `bytes` field).
    /// Inside [`with_shared_ids`], equal ids share one text.
    pub fn from_base64(text: &str) -> Result<Option<Self>, base64::DecodeError> {
        if text.is_empty() {
            return Ok(None);
        }
        let shared = SHARED.with_borrow(|shared| shared.as_ref()?.get(text).cloned());
        if let Some(id) = shared {
            return Ok(Some(id));
        }
        let id = decode_base64(text, Self::from_bytes)?;
        if let Some(id) = &id {
            SHARED.with_borrow_mut(|shared| {
                if let Some(shared) = shared {
                    shared.insert(text.into(), id.clone());
                }
            });
        }
        Ok(id)
    }

    /// Builds an ID from raw bytes.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self::with_hex(bytes, |hex| Self(Arc::from(hex)))
    }

    /// `make` of the lowercase hex form of `bytes`.
    fn with_hex(bytes: &[u8], make: impl FnOnce(&str) -> Self) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        // Every Ray id is at most 28 bytes: the digits go on the stack.
        let mut buffer = [0u8; 64];
        let mut longer = Vec::new();
        let hex = match buffer.get_mut(..bytes.len() * 2) {
            Some(hex) => hex,
            None => {
                longer.resize(bytes.len() * 2, 0);
                longer.as_mut_slice()
            }
        };
        for (pair, byte) in hex.chunks_exact_mut(2).zip(bytes) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        // Hex digits are ASCII, so the conversion cannot fail.
        make(std::str::from_utf8(hex).unwrap_or_default())
    }

    /// Reads the lowercase hex form back; `None` unless it is non-empty, even-length lowercase
    /// hex.
    pub fn from_hex(hex: &str) -> Option<Self> {
        let valid = !hex.is_empty()
            && hex.len().is_multiple_of(2)
            && hex
                .bytes()
                .all(|digit| matches!(digit, b'0'..=b'9' | b'a'..=b'f'));
        valid.then(|| Self(hex.into()))
    }

    /// The lowercase hex form.
    pub fn as_hex(&self) -> &str {
        &self.0
    }

    /// The raw bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = vec![0; self.byte_len()];
        self.decode_into(&mut bytes);
        bytes
    }

    /// Ray's wire form: padded standard base64.
    pub fn to_base64(&self) -> String {
        // Every Ray id is at most 28 bytes: decode on the stack, as synthetic traffic writes
        // several per event.
        let mut buffer = [0u8; 32];
        match buffer.get_mut(..self.byte_len()) {
            Some(bytes) => {
                self.decode_into(bytes);
                BASE64.encode(bytes)
            }
            None => BASE64.encode(self.to_bytes()),
        }
    }

    /// Decodes the hex form into `bytes`, which is `byte_len()` long.
    fn decode_into(&self, bytes: &mut [u8]) {
        fn nibble(digit: u8) -> u8 {
            // `Id` holds lowercase hex only (see the constructors).
            if digit >= b'a' {
                digit - b'a' + 10
            } else {
                digit - b'0'
            }
        }
        for (byte, pair) in bytes.iter_mut().zip(self.0.as_bytes().chunks_exact(2)) {
            *byte = (nibble(pair[0]) << 4) | nibble(pair[1]);
        }
    }

    /// True for Ray's nil IDs, which are all `0xff` bytes.
    pub fn is_nil(&self) -> bool {
        self.0.bytes().all(|digit| digit == b'f')
    }

    /// Number of bytes the ID encodes.
    pub fn byte_len(&self) -> usize {
        self.0.len() / 2
    }
}

/// `make` of the base64 `text`'s bytes; `None` for the empty string.
fn decode_base64<T>(
    text: &str,
    make: impl FnOnce(&[u8]) -> T,
) -> Result<Option<T>, base64::DecodeError> {
    if text.is_empty() {
        return Ok(None);
    }
    // Every Ray id is at most 28 bytes: decode on the stack.
    let mut buffer = [0u8; 48];
    match BASE64.decode_slice(text, &mut buffer) {
        Ok(len) => Ok(Some(make(buffer.get(..len).unwrap_or_default()))),
        Err(base64::DecodeSliceError::OutputSliceTooSmall) => Ok(Some(make(&BASE64.decode(text)?))),
        Err(base64::DecodeSliceError::DecodeError(err)) => Err(err),
    }
}

/// An event's own id (`eventId`): unique to the event, so it is only compared, to drop the
/// copies a re-sent batch repeats, and written back as it came; never shown, stored in a table
/// or shared. Held as its bytes, inline.
///
/// Read as an [`Id`], each would be decoded, hex-encoded into an allocation, then decoded back
/// to bytes for the run's set of ids seen: CPU spent on a value no one reads.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EventId(EventBytes);

/// An [`EventId`]'s bytes.
#[derive(Clone, PartialEq, Eq, Hash)]
enum EventBytes {
    /// Up to [`EventId::INLINE`] bytes (Ray's are 28): their count, then them, then zeros.
    Inline([u8; EventId::INLINE + 1]),
    /// Longer, which Ray does not send.
    Long(Box<[u8]>),
}

impl EventId {
    /// Longest id held inline.
    const INLINE: usize = 31;

    /// Decodes Ray's base64 form. Returns `None` for the empty string (an unset id).
    pub fn from_base64(text: &str) -> Result<Option<Self>, base64::DecodeError> {
        decode_base64(text, Self::from_bytes)
    }

    /// The id of these bytes.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let mut inline = [0u8; Self::INLINE + 1];
        let (count, rest) = inline.split_at_mut(1);
        match (rest.get_mut(..bytes.len()), u8::try_from(bytes.len())) {
            (Some(held), Ok(length)) => {
                held.copy_from_slice(bytes);
                count[0] = length;
                Self(EventBytes::Inline(inline))
            }
            _ => Self(EventBytes::Long(bytes.into())),
        }
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            EventBytes::Inline(inline) => {
                inline.get(1..=usize::from(inline[0])).unwrap_or_default()
            }
            EventBytes::Long(bytes) => bytes,
        }
    }

    /// Ray's wire form: padded standard base64.
    pub fn to_base64(&self) -> String {
        BASE64.encode(self.as_bytes())
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EventId(")?;
        for byte in self.as_bytes() {
            write!(f, "{byte:02x}")?;
        }
        f.write_str(")")
    }
}

thread_local! {
    /// The ids read so far on this thread inside [`with_shared_ids`], if it is running, by
    /// the base64 text they were read from.
    static SHARED: RefCell<Option<SharedIds>> = const { RefCell::new(None) };
}

/// Ids by their wire text.
type SharedIds = HashMap<Box<str>, Id, foldhash::fast::RandomState>;

/// Runs `read` so that the equal ids it decodes on this thread share one allocation.
///
/// A raw object names the same job, node, worker and parent task in nearly every event: shared,
/// they cost one hash lookup each instead of an allocation, a hex encoding and a free, and the
/// attempts that keep them hold one copy (decoding ids is much of parsing). They are looked up
/// by the text sent, before it is decoded, so that a repeat is neither decoded nor hex-encoded
/// again. The ids seen are forgotten when `read` returns, so nothing outlives the object
/// read.
pub fn with_shared_ids<T>(read: impl FnOnce() -> T) -> T {
    /// Restores the enclosing scope's ids, even when `read` panics.
    struct Restore(Option<SharedIds>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SHARED.set(self.0.take());
        }
    }
    let _restore = Restore(SHARED.replace(Some(HashMap::default())));
    read()
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Id({})", self.0)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An optional `bytes` ID: absent, `null` and `""` all read as `None`, which is written as `""`
/// (proto3 prints an unset `bytes` field as the empty string).
pub mod opt_id {
    use serde::de::Deserializer;
    use serde::ser::Serializer;

    use super::Id;

    /// Reads Ray's base64 form.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Id>, D::Error> {
        let decoded = super::read_text(deserializer, "a base64 id or null", |text| {
            Id::from_base64(text).map_err(|err| super::invalid_id(text, &err))
        })?;
        Ok(decoded.flatten())
    }

    /// Writes Ray's base64 form.
    pub fn serialize<S: Serializer>(id: &Option<Id>, serializer: S) -> Result<S::Ok, S::Error> {
        match id {
            Some(id) => serializer.serialize_str(&id.to_base64()),
            None => serializer.serialize_str(""),
        }
    }
}

/// Why `text` is not an id, as every id reader says it.
fn invalid_id(text: &str, err: &base64::DecodeError) -> String {
    format!("invalid base64 ID {text:?}: {err}")
}

/// An optional [`EventId`], read as [`opt_id`] reads ids. (Events are written by
/// `RayEvent`'s own `Serialize`, with [`EventId::to_base64`].)
pub mod opt_event_id {
    use serde::de::Deserializer;

    use super::EventId;

    /// Reads Ray's base64 form.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<EventId>, D::Error> {
        let decoded = super::read_text(deserializer, "a base64 id or null", |text| {
            EventId::from_base64(text).map_err(|err| super::invalid_id(text, &err))
        })?;
        Ok(decoded.flatten())
    }
}

/// A `map<string, bytes>` of IDs; empty values are dropped on reading.
pub mod id_map {
    use std::collections::BTreeMap;

    use serde::de::{self, Deserialize, Deserializer};
    use serde::ser::{SerializeMap, Serializer};

    use super::Id;

    /// Reads base64 values into hex IDs.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<String, Id>, D::Error> {
        let raw: Option<BTreeMap<String, String>> = Option::deserialize(deserializer)?;
        let mut ids = BTreeMap::new();
        for (key, text) in raw.unwrap_or_default() {
            let id = Id::from_base64(&text)
                .map_err(|err| de::Error::custom(super::invalid_id(&text, &err)))?;
            if let Some(id) = id {
                ids.insert(key, id);
            }
        }
        Ok(ids)
    }

    /// Writes each ID as base64.
    pub fn serialize<S: Serializer>(
        ids: &BTreeMap<String, Id>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(ids.len()))?;
        for (key, id) in ids {
            map.serialize_entry(key, &id.to_base64())?;
        }
        map.end()
    }
}

/// A protobuf `int64`/`uint64`: a JSON string of digits (read leniently from a number too).
pub mod int64 {
    use std::fmt;

    use serde::de::{self, Deserializer, Visitor};
    use serde::ser::Serializer;

    /// Reads a string of digits or a number.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
        struct Int64;
        impl Visitor<'_> for Int64 {
            type Value = i64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a 64-bit integer as a string or number")
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<i64, E> {
                Ok(value)
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<i64, E> {
                i64::try_from(value).map_err(|_| E::custom(format_args!("{value} overflows int64")))
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<i64, E> {
                if value.fract() == 0.0 && value.abs() < 9.0e15 {
                    #[allow(clippy::cast_possible_truncation)]
                    Ok(value as i64)
                } else {
                    Err(E::custom(format_args!("{value} is not an integer")))
                }
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<i64, E> {
                if let Ok(value) = text.parse::<i64>() {
                    return Ok(value);
                }
                // uint64 values above i64::MAX would only come from corrupt data; saturate
                // rather than reject the whole event.
                text.parse::<u64>()
                    .map(|_| i64::MAX)
                    .map_err(|_| E::custom(format_args!("{text:?} is not a 64-bit integer")))
            }
            fn visit_unit<E: de::Error>(self) -> Result<i64, E> {
                Ok(0)
            }
        }
        deserializer.deserialize_any(Int64)
    }

    /// Writes the decimal string proto3 JSON uses for 64-bit integers.
    pub fn serialize<S: Serializer>(value: &i64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(itoa::Buffer::new().format(*value))
    }
}

/// Like [`int64`] but `None` when the field is absent or `null` (proto3 `optional int64`); pair
/// it with `skip_serializing_if = "Option::is_none"`, as proto3 omits an unset optional.
pub mod opt_int64 {
    use serde::ser::Serializer;
    use serde::{Deserialize, Deserializer};

    /// Reads an optional string of digits or number.
    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<i64>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapper(#[serde(with = "super::int64")] i64);
        Option::<Wrapper>::deserialize(deserializer)
            .map(|wrapped| wrapped.map(|Wrapper(value)| value))
    }

    /// Writes the decimal string, or `null` if not skipped.
    pub fn serialize<S: Serializer>(value: &Option<i64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => super::int64::serialize(value, serializer),
            None => serializer.serialize_none(),
        }
    }
}

/// A `google.protobuf.Timestamp`, as nanoseconds since the Unix epoch (UTC).
///
/// Ray prints RFC 3339 with 0, 3, 6 or 9 fractional digits (`…54Z`, `…54.627Z`,
/// `…54.629442378Z`); any count from 0 to 9 and any UTC offset are accepted. It is written the
/// way protobuf prints it: UTC, with 0, 3, 6 or 9 fractional digits, as few as are exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp(i64);

impl Timestamp {
    /// From nanoseconds since the epoch.
    pub const fn from_nanos(nanos: i64) -> Self {
        Self(nanos)
    }

    /// Nanoseconds since the epoch.
    pub const fn nanos(self) -> i64 {
        self.0
    }

    /// Milliseconds since the epoch, rounded down, as Ray's state API reports them.
    pub const fn millis(self) -> i64 {
        self.0.div_euclid(1_000_000)
    }

    /// Parses an RFC 3339 timestamp.
    pub fn parse_rfc3339(text: &str) -> Result<Self, TimestampError> {
        if let Some(nanos) = parse_utc(text.as_bytes()) {
            return Ok(Self(nanos));
        }
        let parsed =
            chrono::DateTime::parse_from_rfc3339(text).map_err(|source| TimestampError {
                text: text.to_owned(),
                reason: source.to_string(),
            })?;
        parsed
            .timestamp_nanos_opt()
            .map(Self)
            .ok_or_else(|| TimestampError {
                text: text.to_owned(),
                reason: "outside the range of 64-bit nanoseconds (years 1677–2262)".to_owned(),
            })
    }
}

/// The nanoseconds of the form Ray prints, `YYYY-MM-DDTHH:MM:SS[.fraction]Z` with 1 to 9
/// fractional digits, between 1970 and 2261; `None` for anything else, which chrono reads.
///
/// Every event carries two to four timestamps; chrono's general RFC 3339 reader pays, on every
/// one, for offsets, leap seconds and far years, which Ray never sends.
fn parse_utc(text: &[u8]) -> Option<i64> {
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        text.get(range)?.iter().try_fold(0i64, |value, byte| {
            byte.is_ascii_digit()
                .then(|| value * 10 + i64::from(byte - b'0'))
        })
    };
    let at = |index: usize, byte: u8| text.get(index) == Some(&byte);
    if !(at(4, b'-') && at(7, b'-') && at(10, b'T') && at(13, b':') && at(16, b':')) {
        return None;
    }
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (hour, minute, second) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    if !(1970..=2261).contains(&year)
        || !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let nanos = match text.get(19..)? {
        b"Z" => 0,
        [b'.', fraction @ .., b'Z'] if (1..=9).contains(&fraction.len()) => {
            let value = digits(20..20 + fraction.len())?;
            value * 10i64.pow(9 - fraction.len() as u32)
        }
        _ => return None,
    };
    let seconds = ((days_from_civil(year, month, day) * 24 + hour) * 60 + minute) * 60 + second;
    Some(seconds * 1_000_000_000 + nanos)
}

/// Days in `month` (1–12) of `year`, Gregorian.
fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use chrono::{Datelike as _, Timelike as _};
        let seconds = self.0.div_euclid(1_000_000_000);
        let nanos = self.0.rem_euclid(1_000_000_000);
        // Every i64 of nanoseconds is within chrono's range; this cannot fail.
        let Some(time) = chrono::DateTime::from_timestamp(seconds, 0) else {
            return Err(fmt::Error);
        };
        // Fields rather than a strftime pattern: synthetic traffic writes millions of these.
        write!(
            f,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            time.year(),
            time.month(),
            time.day(),
            time.hour(),
            time.minute(),
            time.second()
        )?;
        match nanos {
            0 => {}
            _ if nanos % 1_000_000 == 0 => write!(f, ".{:03}", nanos / 1_000_000)?,
            _ if nanos % 1_000 == 0 => write!(f, ".{:06}", nanos / 1_000)?,
            _ => write!(f, ".{nanos:09}")?,
        }
        f.write_str("Z")
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A timestamp that is not RFC 3339.
#[derive(Debug, thiserror::Error)]
#[error("invalid RFC 3339 timestamp {text:?}: {reason}")]
pub struct TimestampError {
    text: String,
    reason: String,
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        read_text(deserializer, "an RFC 3339 timestamp", Self::parse_rfc3339)?.ok_or_else(|| {
            de::Error::invalid_type(de::Unexpected::Other("null"), &"an RFC 3339 timestamp")
        })
    }
}

/// Reads a JSON string with `read`, without copying it; `null` reads as `None`.
///
/// serde's `Cow<str>` is always an owned copy: an allocation and a copy for every id and
/// timestamp, which are most of an event's strings. `read` sees the text in place (or, when it
/// has escapes, in the parser's scratch buffer).
fn read_text<'de, D, T, E>(
    deserializer: D,
    expecting: &'static str,
    read: impl FnOnce(&str) -> Result<T, E>,
) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    E: fmt::Display,
{
    /// The visitor: `read` once, for the string; what is expected, for errors.
    struct Text<F>(&'static str, F);

    impl<'de, T, E, F> Visitor<'de> for Text<F>
    where
        E: fmt::Display,
        F: FnOnce(&str) -> Result<T, E>,
    {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }

        fn visit_str<R: de::Error>(self, text: &str) -> Result<Self::Value, R> {
            (self.1)(text).map(Some).map_err(R::custom)
        }

        fn visit_none<R: de::Error>(self) -> Result<Self::Value, R> {
            Ok(None)
        }

        fn visit_unit<R: de::Error>(self) -> Result<Self::Value, R> {
            Ok(None)
        }

        fn visit_some<S: Deserializer<'de>>(self, text: S) -> Result<Self::Value, S::Error> {
            text.deserialize_str(self)
        }
    }

    deserializer.deserialize_option(Text(expecting, read))
}

/// Declares a protobuf enum as Ray prints it: by name, with the proto number kept so that the
/// numeric forms (unknown-to-sender values, 2.49's `taskState` map keys) still map, and an
/// `Unknown` variant so that names added by later Ray releases never fail an event.
macro_rules! ray_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $number:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        $vis enum $name {
            $(
                $(#[$vmeta])*
                #[doc = concat!("`", stringify!($variant), "` (proto number ", stringify!($number), ").")]
                $variant,
            )+
            /// A name (or number) this build does not know; kept verbatim.
            Unknown(Box<str>),
        }

        impl $name {
            /// The name Ray prints, or the unknown text as received.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => stringify!($variant), )+
                    Self::Unknown(text) => text,
                }
            }

            /// The proto number, where this build knows it.
            pub fn number(&self) -> Option<i32> {
                match self {
                    $( Self::$variant => Some($number), )+
                    Self::Unknown(_) => None,
                }
            }

            /// Reads a name as Ray prints it.
            pub fn from_name(name: &str) -> Self {
                match name {
                    $( stringify!($variant) => Self::$variant, )+
                    other => Self::Unknown(other.into()),
                }
            }

            /// Reads a proto number.
            pub fn from_number(number: i64) -> Self {
                match number {
                    $( $number => Self::$variant, )+
                    other => Self::Unknown(other.to_string().into_boxed_str()),
                }
            }
        }

        impl Default for $name {
            /// Proto3's default is the variant numbered 0.
            fn default() -> Self {
                Self::from_number(0)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                $crate::event::encoding::deserialize_enum(deserializer, Self::from_name, Self::from_number)
            }
        }
    };
}
pub(crate) use ray_enum;

/// Shared body of every `ray_enum!` deserializer: a name string, a number, or `null` (default).
pub(crate) fn deserialize_enum<'de, D, T>(
    deserializer: D,
    from_name: fn(&str) -> T,
    from_number: fn(i64) -> T,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
{
    struct EnumVisitor<T> {
        from_name: fn(&str) -> T,
        from_number: fn(i64) -> T,
    }
    impl<T> Visitor<'_> for EnumVisitor<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an enum name or number")
        }
        fn visit_str<E: de::Error>(self, name: &str) -> Result<T, E> {
            Ok((self.from_name)(name))
        }
        fn visit_i64<E: de::Error>(self, number: i64) -> Result<T, E> {
            Ok((self.from_number)(number))
        }
        fn visit_u64<E: de::Error>(self, number: u64) -> Result<T, E> {
            Ok((self.from_number)(
                i64::try_from(number).unwrap_or(i64::MAX),
            ))
        }
        fn visit_unit<E: de::Error>(self) -> Result<T, E> {
            Ok((self.from_number)(0))
        }
    }
    deserializer.deserialize_any(EnumVisitor {
        from_name,
        from_number,
    })
}

#[cfg(test)]
#[allow(unreachable_pub)]
mod tests;
