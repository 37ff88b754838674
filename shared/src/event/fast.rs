//! A fast reader of the three events that are nearly all of Ray's traffic (task definitions,
//! actor task definitions and task lifecycles) in the shapes Ray's aggregator prints them.
//!
//! serde builds an event through a generic visitor per struct, with an optional box for each of
//! the envelope's seventeen payload keys, moved from frame to frame as it returns: that, not
//! reading the JSON, is most of parsing with serde, and parsing is much of a compaction run's
//! CPU. This reader fills the event where it will stay.
//!
//! It never decides what an event means. It reads only what it can read exactly as the serde
//! reader would, and declines (`None`) anything else: a key it does not know, a repeated key,
//! a `null`, an escaped key, a number that is not a plain integer where one is wanted, an
//! error payload, an escape it cannot decode. The caller then reads the text with serde, which
//! stays the definition of an event and of why one is malformed; the tests hold the two equal
//! on every captured event and on mutated ones.

use std::borrow::Cow;
use std::collections::BTreeMap;

use super::common::{FunctionDescriptor, Language, PythonFunctionDescriptor, TaskStatus, TaskType};
use super::encoding::{EventId, Id, Timestamp};
use super::task::{
    ActorTaskDefinitionEvent, TaskDefinitionEvent, TaskLifecycleEvent, TaskLogInfo,
    TaskStateTransition,
};
use super::{EventPayload, EventType, RayEvent, Severity, SourceType};

/// Reads `text` as one of the events this reader knows, or `None` to leave it to serde.
pub(super) fn read_event(text: &str) -> Option<RayEvent> {
    let mut reader = Reader::new(text);
    let mut envelope = Envelope::default();
    let mut seen = Seen::default();
    reader.object(|reader, key| envelope.field(reader, key, &mut seen))?;
    reader.end()?;
    envelope.event()
}

/// The envelope's fields as read so far.
#[derive(Default)]
struct Envelope {
    event_id: Option<EventId>,
    source_type: SourceType,
    event_type: EventType,
    timestamp: Option<Timestamp>,
    severity: Severity,
    message: String,
    session_name: String,
    node_id: Option<Id>,
    payload: Option<EventPayload>,
}

impl Envelope {
    /// Reads the value of `key`.
    fn field<'a>(&mut self, reader: &mut Reader<'a>, key: &'a str, seen: &mut Seen) -> Option<()> {
        use EventPayload as P;
        match key {
            "eventId" | "event_id" => {
                seen.first(0)?;
                self.event_id = EventId::from_base64(&reader.string()?).ok()?;
            }
            "sourceType" | "source_type" => {
                seen.first(1)?;
                self.source_type = SourceType::from_name(&reader.string()?);
            }
            "eventType" | "event_type" => {
                seen.first(2)?;
                self.event_type = EventType::from_name(&reader.string()?);
            }
            "timestamp" => {
                seen.first(3)?;
                self.timestamp = Some(reader.timestamp()?);
            }
            "severity" => {
                seen.first(4)?;
                self.severity = Severity::from_name(&reader.string()?);
            }
            "message" => {
                seen.first(5)?;
                self.message = reader.string()?.into_owned();
            }
            "sessionName" | "session_name" => {
                seen.first(6)?;
                self.session_name = reader.string()?.into_owned();
            }
            "nodeId" | "node_id" => {
                seen.first(7)?;
                self.node_id = reader.id(Id::from_base64)?;
            }
            "taskDefinitionEvent" | "task_definition_event" => {
                seen.first(8)?;
                self.payload(P::TaskDefinition(definition(reader)?))?;
            }
            "actorTaskDefinitionEvent" | "actor_task_definition_event" => {
                seen.first(9)?;
                self.payload(P::ActorTaskDefinition(actor_task_definition(reader)?))?;
            }
            "taskLifecycleEvent" | "task_lifecycle_event" => {
                seen.first(10)?;
                self.payload(P::TaskLifecycle(lifecycle(reader)?))?;
            }
            _ => return None,
        }
        Some(())
    }

    /// Keeps the event's payload; serde reads every payload sent and keeps the one the type
    /// names, so an event with two is left to it.
    fn payload(&mut self, payload: EventPayload) -> Option<()> {
        self.payload.is_none().then(|| self.payload = Some(payload))
    }

    /// The event, if its type names the payload read.
    fn event(self) -> Option<RayEvent> {
        use EventPayload as P;
        let payload = self.payload?;
        let named = matches!(
            (&self.event_type, &payload),
            (EventType::TASK_DEFINITION_EVENT, P::TaskDefinition(_))
                | (
                    EventType::ACTOR_TASK_DEFINITION_EVENT,
                    P::ActorTaskDefinition(_)
                )
                | (EventType::TASK_LIFECYCLE_EVENT, P::TaskLifecycle(_))
        );
        named.then_some(RayEvent {
            event_id: self.event_id,
            source_type: self.source_type,
            event_type: self.event_type,
            timestamp: self.timestamp,
            severity: self.severity,
            message: self.message,
            session_name: self.session_name,
            node_id: self.node_id,
            payload,
        })
    }
}

/// Reads into `$event` the value of `$key` when it is one of the fields task definitions and
/// actor task definitions share (the same names, types and readings), marking it in `$seen`
/// (bits 0–11); evaluates to `None` when it is not one of them or its value is not read.
/// A macro, as the two are different types whose fields are named alike.
macro_rules! definition_field {
    ($event:expr, $reader:expr, $key:expr, $seen:expr) => {{
        let (event, reader, seen) = ($event, $reader, $seen);
        match $key {
            "taskId" | "task_id" => {
                seen.first(0)?;
                event.task_id = reader.id(Id::from_base64)?;
            }
            "taskAttempt" | "task_attempt" => {
                seen.first(1)?;
                event.task_attempt = reader.int()?;
            }
            "language" => {
                seen.first(2)?;
                event.language = Language::from_name(&reader.string()?);
            }
            "requiredResources" | "required_resources" => {
                seen.first(3)?;
                event.required_resources = resources(reader)?;
            }
            "jobId" | "job_id" => {
                seen.first(4)?;
                event.job_id = reader.id(Id::from_base64)?;
            }
            "parentTaskId" | "parent_task_id" => {
                seen.first(5)?;
                event.parent_task_id = reader.id(Id::from_base64)?;
            }
            "placementGroupId" | "placement_group_id" => {
                seen.first(6)?;
                event.placement_group_id = reader.id(Id::from_base64)?;
            }
            "refIds" | "ref_ids" => {
                seen.first(7)?;
                event.ref_ids = ref_ids(reader)?;
            }
            "serializedRuntimeEnv" | "serialized_runtime_env" => {
                seen.first(8)?;
                event.serialized_runtime_env = reader.string()?.into_owned();
            }
            "callSite" | "call_site" => {
                seen.first(9)?;
                event.call_site = Some(reader.string()?.into_owned());
            }
            "labelSelector" | "label_selector" => {
                seen.first(10)?;
                event.label_selector = labels(reader)?;
            }
            "isDetachedActor" | "is_detached_actor" => {
                seen.first(11)?;
                event.is_detached_actor = reader.boolean()?;
            }
            _ => return None,
        }
        Some(())
    }};
}

/// `taskDefinitionEvent`.
fn definition(reader: &mut Reader<'_>) -> Option<Box<TaskDefinitionEvent>> {
    let mut event = Box::<TaskDefinitionEvent>::default();
    let mut seen = Seen::default();
    reader.object(|reader, key| {
        match key {
            "taskType" | "task_type" => {
                seen.first(12)?;
                event.task_type = TaskType::from_name(&reader.string()?);
            }
            "taskFunc" | "task_func" => {
                seen.first(13)?;
                event.task_func = function(reader)?;
            }
            "taskName" | "task_name" => {
                seen.first(14)?;
                event.task_name = reader.string()?.into_owned();
            }
            _ => return definition_field!(&mut event, reader, key, &mut seen),
        }
        Some(())
    })?;
    Some(event)
}

/// `actorTaskDefinitionEvent`.
fn actor_task_definition(reader: &mut Reader<'_>) -> Option<Box<ActorTaskDefinitionEvent>> {
    let mut event = Box::<ActorTaskDefinitionEvent>::default();
    let mut seen = Seen::default();
    reader.object(|reader, key| {
        match key {
            "actorFunc" | "actor_func" => {
                seen.first(12)?;
                event.actor_func = function(reader)?;
            }
            "actorTaskName" | "actor_task_name" => {
                seen.first(13)?;
                event.actor_task_name = reader.string()?.into_owned();
            }
            "actorId" | "actor_id" => {
                seen.first(14)?;
                event.actor_id = reader.id(Id::from_base64)?;
            }
            _ => return definition_field!(&mut event, reader, key, &mut seen),
        }
        Some(())
    })?;
    Some(event)
}

/// `taskLifecycleEvent`. One carrying `rayErrorInfo` (a failure, a few in a hundred) is left
/// to serde, whose error types are many and nested.
fn lifecycle(reader: &mut Reader<'_>) -> Option<Box<TaskLifecycleEvent>> {
    let mut event = Box::<TaskLifecycleEvent>::default();
    let mut seen = Seen::default();
    reader.object(|reader, key| {
        match key {
            "taskId" | "task_id" => {
                seen.first(0)?;
                event.task_id = reader.id(Id::from_base64)?;
            }
            "taskAttempt" | "task_attempt" => {
                seen.first(1)?;
                event.task_attempt = reader.int()?;
            }
            "stateTransitions" | "state_transitions" => {
                seen.first(2)?;
                reader.array(|reader| {
                    event.state_transitions.push(transition(reader)?);
                    Some(())
                })?;
            }
            "nodeId" | "node_id" => {
                seen.first(3)?;
                event.node_id = reader.id(Id::from_base64)?;
            }
            "workerId" | "worker_id" => {
                seen.first(4)?;
                event.worker_id = reader.id(Id::from_base64)?;
            }
            "workerPid" | "worker_pid" => {
                seen.first(5)?;
                event.worker_pid = reader.int()?;
            }
            "jobId" | "job_id" => {
                seen.first(6)?;
                event.job_id = reader.id(Id::from_base64)?;
            }
            "isDebuggerPaused" | "is_debugger_paused" => {
                seen.first(7)?;
                event.is_debugger_paused = Some(reader.boolean()?);
            }
            "actorReprName" | "actor_repr_name" => {
                seen.first(8)?;
                event.actor_repr_name = Some(reader.string()?.into_owned());
            }
            "taskLogInfo" | "task_log_info" => {
                seen.first(9)?;
                event.task_log_info = Some(log_info(reader)?);
            }
            _ => return None,
        }
        Some(())
    })?;
    Some(event)
}

/// One of `stateTransitions`: its state (proto3's default when absent) and its required time.
fn transition(reader: &mut Reader<'_>) -> Option<TaskStateTransition> {
    let mut state = TaskStatus::default();
    let mut timestamp = None;
    let mut seen = Seen::default();
    reader.object(|reader, key| {
        match key {
            "state" => {
                seen.first(0)?;
                state = TaskStatus::from_name(&reader.string()?);
            }
            "timestamp" => {
                seen.first(1)?;
                timestamp = Some(reader.timestamp()?);
            }
            _ => return None,
        }
        Some(())
    })?;
    Some(TaskStateTransition {
        state,
        timestamp: timestamp?,
    })
}

/// `taskLogInfo`.
fn log_info(reader: &mut Reader<'_>) -> Option<TaskLogInfo> {
    let mut info = TaskLogInfo::default();
    let mut seen = Seen::default();
    reader.object(|reader, key| {
        match key {
            "stdoutFile" | "stdout_file" => {
                seen.first(0)?;
                info.stdout_file = Some(reader.string()?.into_owned());
            }
            "stderrFile" | "stderr_file" => {
                seen.first(1)?;
                info.stderr_file = Some(reader.string()?.into_owned());
            }
            "stdoutStart" | "stdout_start" => {
                seen.first(2)?;
                info.stdout_start = Some(reader.int64()?);
            }
            "stdoutEnd" | "stdout_end" => {
                seen.first(3)?;
                info.stdout_end = Some(reader.int64()?);
            }
            "stderrStart" | "stderr_start" => {
                seen.first(4)?;
                info.stderr_start = Some(reader.int64()?);
            }
            "stderrEnd" | "stderr_end" => {
                seen.first(5)?;
                info.stderr_end = Some(reader.int64()?);
            }
            _ => return None,
        }
        Some(())
    })?;
    Some(info)
}

/// `taskFunc` / `actorFunc`: a Python function (Java and C++ are left to serde).
fn function(reader: &mut Reader<'_>) -> Option<FunctionDescriptor> {
    let mut descriptor = FunctionDescriptor::default();
    let mut seen = Seen::default();
    reader.object(|reader, key| match key {
        "pythonFunctionDescriptor" | "python_function_descriptor" => {
            seen.first(0)?;
            descriptor.python_function_descriptor = Some(python_function(reader)?);
            Some(())
        }
        _ => None,
    })?;
    Some(descriptor)
}

/// `pythonFunctionDescriptor`.
fn python_function(reader: &mut Reader<'_>) -> Option<PythonFunctionDescriptor> {
    let mut function = PythonFunctionDescriptor::default();
    let mut seen = Seen::default();
    reader.object(|reader, key| {
        let (bit, field) = match key {
            "moduleName" | "module_name" => (0, &mut function.module_name),
            "className" | "class_name" => (1, &mut function.class_name),
            "functionName" | "function_name" => (2, &mut function.function_name),
            "functionHash" | "function_hash" => (3, &mut function.function_hash),
            _ => return None,
        };
        seen.first(bit)?;
        *field = reader.string()?.into_owned();
        Some(())
    })?;
    Some(function)
}

/// `requiredResources`: a later repeat of a name replaces it, as in serde's map.
fn resources(reader: &mut Reader<'_>) -> Option<BTreeMap<String, f64>> {
    let mut resources = BTreeMap::new();
    reader.object(|reader, key| {
        resources.insert(key.to_owned(), reader.float()?);
        Some(())
    })?;
    Some(resources)
}

/// `labelSelector`.
fn labels(reader: &mut Reader<'_>) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    reader.object(|reader, key| {
        labels.insert(key.to_owned(), reader.string()?.into_owned());
        Some(())
    })?;
    Some(labels)
}

/// `refIds`: read whole first and decoded after, as serde's `id_map` does, so that a repeated
/// name's last text decides (an empty one drops it).
fn ref_ids(reader: &mut Reader<'_>) -> Option<BTreeMap<String, Id>> {
    let mut texts = BTreeMap::new();
    reader.object(|reader, key| {
        texts.insert(key, reader.string()?);
        Some(())
    })?;
    let mut ids = BTreeMap::new();
    for (key, text) in texts {
        if let Some(id) = Id::from_base64(&text).ok()? {
            ids.insert(key.to_owned(), id);
        }
    }
    Some(ids)
}

/// Which of an object's keys were read: a repeat is left to serde (which rejects it).
#[derive(Default)]
struct Seen(u32);

impl Seen {
    /// `Some` the first time `bit` is given.
    fn first(&mut self, bit: u32) -> Option<()> {
        let mask = 1 << bit;
        (self.0 & mask == 0).then(|| self.0 |= mask)
    }
}

/// The length of the run of plain string text `bytes` starts with: up to the first quote,
/// backslash or control character. Eight bytes at a time, as serde_json scans: a byte at a
/// time, scanning strings is a large share of reading an event. Not inlined, and over the
/// whole words split off first: inlined into the string reader, the loop has too few registers
/// for its constants and loads several of them again every word.
#[inline(never)]
fn plain_run(bytes: &[u8]) -> usize {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    /// High bit set in each byte of `word` that is zero; the lowest one set is exact (a
    /// borrow only marks bytes above a zero byte).
    fn zero_bytes(word: u64) -> u64 {
        word.wrapping_sub(ONES) & !word & HIGH
    }
    let (words, tail) = bytes.as_chunks::<8>();
    for (index, word) in words.iter().enumerate() {
        let word = u64::from_le_bytes(*word);
        let ends = zero_bytes(word ^ (ONES * u64::from(b'"')))
            | zero_bytes(word ^ (ONES * u64::from(b'\\')))
            // Bytes below 0x20: the same borrow trick, against 0x20.
            | (word.wrapping_sub(ONES * 0x20) & !word & HIGH);
        if ends != 0 {
            return index * 8 + (ends.trailing_zeros() / 8) as usize;
        }
    }
    let at = words.len() * 8;
    at + tail
        .iter()
        .position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)
        .unwrap_or(tail.len())
}

/// The length of the string text `bytes` starts with, escapes as sent, which bounds the
/// length of its unescaped text: up to its closing quote, or to what ends it wrongly (a
/// control character, the end of `bytes`). A backslash and the byte after it are passed
/// over whatever that byte is; the reader refuses a wrong escape itself.
fn quoted_length(bytes: &[u8]) -> usize {
    let mut at = 0;
    loop {
        at += plain_run(bytes.get(at..).unwrap_or_default());
        match bytes.get(at) {
            // The escaped character cannot end the string.
            Some(b'\\') => at += 2,
            _ => return at.min(bytes.len()),
        }
    }
}

/// JSON text read front to back, in the grammar serde_json accepts.
struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Self {
        Self { text, at: 0 }
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// The next byte that is not whitespace, not taken.
    fn peek(&mut self) -> Option<u8> {
        let bytes = self.bytes();
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = bytes.get(self.at) {
            self.at += 1;
        }
        bytes.get(self.at).copied()
    }

    /// Takes `byte`, which must come next.
    fn take(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Takes `byte` if it comes next.
    fn take_if(&mut self, byte: u8) -> bool {
        let next = self.peek() == Some(byte);
        if next {
            self.at += 1;
        }
        next
    }

    /// Nothing but whitespace is left.
    fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// An object, each key handed to `field` to read its value. Keys must be plain text
    /// (serde would unescape them first).
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.take(b'{')?;
        if self.take_if(b'}') {
            return Some(());
        }
        loop {
            let Cow::Borrowed(key) = self.string()? else {
                return None;
            };
            self.take(b':')?;
            field(self, key)?;
            if !self.take_if(b',') {
                return self.take(b'}');
            }
        }
    }

    /// An array, `item` reading each element.
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.take(b'[')?;
        if self.take_if(b']') {
            return Some(());
        }
        loop {
            item(self)?;
            if !self.take_if(b',') {
                return self.take(b']');
            }
        }
    }

    /// A string, in place unless it has escapes.
    ///
    /// Inlined, with what follows an escape out of line: an event has about forty strings, keys
    /// included, and one event in five has an escape. With the escape's decoding inlined into
    /// it, the reader would be a call that saves registers and sets up a large stack frame for
    /// every string.
    #[inline]
    fn string(&mut self) -> Option<Cow<'a, str>> {
        self.take(b'"')?;
        let start = self.at;
        let end = start + plain_run(self.bytes().get(start..)?);
        self.at = end;
        if *self.bytes().get(end)? == b'"' {
            self.at += 1;
            return self.text.get(start..end).map(Cow::Borrowed);
        }
        self.escaped(start).map(Cow::Owned)
    }

    /// The rest of a string that has escapes (or that ends wrongly), from `start`, where its
    /// text began; `self.at` is where the plain text ended.
    #[cold]
    #[inline(never)]
    fn escaped(&mut self, start: usize) -> Option<String> {
        let bytes = self.bytes();
        // Unescaped, the text is never longer than as sent: one allocation, where growing by
        // doubling from the plain text before the first escape would reallocate each runtime
        // env and call site several times. That text is scanned already; only the rest is
        // measured.
        let rest = quoted_length(bytes.get(self.at..)?);
        let mut text = String::with_capacity(self.at - start + rest);
        text.push_str(self.text.get(start..self.at)?);
        loop {
            match *bytes.get(self.at)? {
                b'"' => {
                    self.at += 1;
                    return Some(text);
                }
                b'\\' => {
                    let code = *bytes.get(self.at + 1)?;
                    self.at += 2;
                    text.push(match code {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode()?,
                        _ => return None,
                    });
                }
                0..=0x1f => return None,
                _ => {
                    let run = self.at;
                    self.at += plain_run(bytes.get(run..)?);
                    text.push_str(self.text.get(run..self.at)?);
                }
            }
        }
    }

    /// The character of a `\u` escape (after the `\u`), a surrogate pair read whole; a lone
    /// surrogate is left to serde.
    fn unicode(&mut self) -> Option<char> {
        let first = self.hex4()?;
        match first {
            0xD800..=0xDBFF => {
                if self.bytes().get(self.at..self.at + 2)? != b"\\u" {
                    return None;
                }
                self.at += 2;
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return None;
                }
                char::from_u32(0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00))
            }
            0xDC00..=0xDFFF => None,
            _ => char::from_u32(first),
        }
    }

    /// Four hex digits.
    fn hex4(&mut self) -> Option<u32> {
        let digits = self.bytes().get(self.at..self.at + 4)?;
        self.at += 4;
        digits.iter().try_fold(0, |value, digit| {
            Some(value * 16 + char::from(*digit).to_digit(16)?)
        })
    }

    /// A JSON integer without fraction or exponent (a leading zero ends it, as in JSON).
    fn integer(&mut self) -> Option<i64> {
        self.peek()?;
        let bytes = self.bytes();
        let negative = bytes.get(self.at) == Some(&b'-');
        if negative {
            self.at += 1;
        }
        let mut value: i64 = 0;
        match *bytes.get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                while let Some(digit @ b'0'..=b'9') = bytes.get(self.at) {
                    value = value
                        .checked_mul(10)?
                        .checked_add(i64::from(digit - b'0'))?;
                    self.at += 1;
                }
            }
            _ => return None,
        }
        // A fraction, an exponent or a digit after a leading zero: serde decides. So it does
        // for `-0`, which serde_json reads as the float -0.0.
        if let Some(b'.' | b'e' | b'E' | b'0'..=b'9') = bytes.get(self.at) {
            return None;
        }
        match (negative, value) {
            (true, 0) => None,
            (true, _) => Some(-value),
            (false, _) => Some(value),
        }
    }

    /// An integer of type `T` (`taskAttempt`, `workerPid`).
    fn int<T: TryFrom<i64>>(&mut self) -> Option<T> {
        T::try_from(self.integer()?).ok()
    }

    /// A protobuf `int64`: a string of digits, or a plain integer.
    fn int64(&mut self) -> Option<i64> {
        if self.peek()? == b'"' {
            self.string()?.parse().ok()
        } else {
            self.integer()
        }
    }

    /// A number as serde_json reads it into an `f64` (resource amounts).
    fn float(&mut self) -> Option<f64> {
        self.peek()?;
        let start = self.at;
        while let Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') = self.bytes().get(self.at) {
            self.at += 1;
        }
        // serde_json's own reading of the number, rounding included.
        serde_json::from_str(self.text.get(start..self.at)?).ok()
    }

    /// `true` or `false`.
    fn boolean(&mut self) -> Option<bool> {
        self.peek()?;
        let rest = self.bytes().get(self.at..)?;
        let (value, length) = if rest.starts_with(b"true") {
            (true, 4)
        } else if rest.starts_with(b"false") {
            (false, 5)
        } else {
            return None;
        };
        self.at += length;
        Some(value)
    }

    /// An id's base64 text, decoded by `decode` (`None` for the empty string).
    fn id(
        &mut self,
        decode: fn(&str) -> Result<Option<Id>, base64::DecodeError>,
    ) -> Option<Option<Id>> {
        decode(&self.string()?).ok()
    }

    /// A timestamp's text, read.
    fn timestamp(&mut self) -> Option<Timestamp> {
        Timestamp::parse_rfc3339(&self.string()?).ok()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::event::split_batch;

    /// Every event of the captured Ray 2.60 runs, as sent.
    fn captured() -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/ray-2.60");
        let mut bodies = Vec::new();
        for run in std::fs::read_dir(&root)? {
            // Runs without bodies (the README) have nothing to read.
            if let Ok(files) = std::fs::read_dir(run?.path().join("bodies")) {
                for file in files {
                    bodies.push(file?.path());
                }
            }
        }
        bodies.sort();
        let mut texts = Vec::new();
        for body in bodies {
            let bytes = std::fs::read(&body)?;
            texts.extend(
                split_batch(&bytes)?
                    .iter()
                    .map(|event| event.get().to_owned()),
            );
        }
        Ok(texts)
    }

    /// Whether the fast reader reads `text`, having checked that serde then reads the same.
    fn agree(text: &str) -> bool {
        let Some(fast) = read_event(text) else {
            return false;
        };
        match RayEvent::from_serde(text) {
            Ok(serde) => assert_eq!(format!("{fast:?}"), format!("{serde:?}"), "{text}"),
            Err(err) => panic!("read what serde rejects ({err}): {text}"),
        }
        true
    }

    /// Whether serde reads `text` as an event this reader is meant to read: a task definition,
    /// actor task definition or lifecycle, of a Python function, without an error.
    fn meant_for_it(text: &str) -> bool {
        use EventPayload as P;
        let python = |function: &FunctionDescriptor| {
            function.java_function_descriptor.is_none()
                && function.cpp_function_descriptor.is_none()
        };
        match RayEvent::from_serde(text).map(|event| event.payload) {
            Ok(P::TaskDefinition(event)) => python(&event.task_func),
            Ok(P::ActorTaskDefinition(event)) => python(&event.actor_func),
            Ok(P::TaskLifecycle(event)) => event.ray_error_info.is_none(),
            _ => false,
        }
    }

    #[test]
    fn every_captured_task_event_reads_as_serde_reads_it() -> Result<(), Box<dyn std::error::Error>>
    {
        let texts = captured()?;
        let (mut read, mut meant) = (0, 0);
        for text in &texts {
            let fast = agree(text);
            if meant_for_it(text) {
                meant += 1;
                assert!(fast, "declined an event it is meant to read: {text}");
            }
            read += usize::from(fast);
        }
        // Each snake-case event is read too (the fixtures hold a run of them).
        assert!(meant > 1000, "{meant} of {} captured events", texts.len());
        assert_eq!(read, meant);
        Ok(())
    }

    /// The captured events of each kind the reader reads, the longest of each: one with a
    /// runtime environment full of escapes, one with log positions, and so on.
    fn samples() -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let mut longest: BTreeMap<(String, bool, bool), String> = BTreeMap::new();
        for text in captured()? {
            let Some(event) = read_event(&text) else {
                continue;
            };
            let kind = (
                event.event_type.to_string(),
                text.contains("sessionName"),
                text.contains("stdoutStart") || text.contains("stdout_start"),
            );
            let kept = longest.entry(kind).or_default();
            if text.len() > kept.len() {
                *kept = text;
            }
        }
        Ok(longest.into_values().collect())
    }

    #[test]
    fn mutated_events_read_as_serde_reads_them_or_are_left_to_it()
    -> Result<(), Box<dyn std::error::Error>> {
        const BYTES: &[u8] = b"\"\\,:{}[] 0-.eEnA/\x01";
        let (mut read, mut declined) = (0, 0);
        let mut check = |bytes: &[u8]| {
            if let Ok(text) = std::str::from_utf8(bytes) {
                if agree(text) {
                    read += 1;
                } else {
                    declined += 1;
                }
            }
        };
        let samples = samples()?;
        assert!(samples.len() >= 4, "{} kinds", samples.len());
        for sample in &samples {
            let bytes = sample.as_bytes();
            for at in 0..=bytes.len() {
                check(&bytes[..at]);
                let mut cut = bytes.to_vec();
                if at < bytes.len() {
                    cut.remove(at);
                    check(&cut);
                }
                let mut spaced = bytes.to_vec();
                spaced.insert(at, b' ');
                check(&spaced);
                for &byte in BYTES {
                    let mut changed = bytes.to_vec();
                    if let Some(old) = changed.get_mut(at) {
                        *old = byte;
                        check(&changed);
                    }
                }
            }
        }
        // Both ways taken: whitespace and many changed characters still read, most do not.
        assert!(
            read > 1000 && declined > 10_000,
            "{read} read, {declined} declined"
        );
        Ok(())
    }

    #[test]
    fn a_plain_run_ends_where_a_byte_at_a_time_scan_ends_it() {
        let naive = |bytes: &[u8]| {
            bytes
                .iter()
                .position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)
                .unwrap_or(bytes.len())
        };
        // Every end byte at every place of texts of 0 to 24 bytes, over fillers that sit on
        // either side of the borrow trick's bounds; and a second end byte after the first.
        let ends = [b'"', b'\\', 0x00, 0x1f, b'\n'];
        let fillers = [b'a', 0x20, 0x21, b'#', b']', 0x7f, 0x80, 0xc3, 0xff];
        let mut checked = 0;
        for length in 0..=24 {
            for &filler in &fillers {
                let plain = vec![filler; length];
                assert_eq!(plain_run(&plain), naive(&plain));
                for at in 0..length {
                    for &end in &ends {
                        let mut bytes = plain.clone();
                        bytes[at] = end;
                        assert_eq!(plain_run(&bytes), at, "{bytes:?}");
                        if let Some(after) = bytes.get_mut(at + 1) {
                            *after = b'"';
                            assert_eq!(plain_run(&bytes), at, "{bytes:?}");
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 10_000);
    }

    #[test]
    fn a_quoted_length_counts_escapes_as_sent_up_to_the_closing_quote()
    -> Result<(), serde_json::Error> {
        for (text, length) in [
            (r#"plain" tail"#, 5),
            (r#"a\"b" tail"#, 4),
            (r#"a\\" tail"#, 3),
            (r#"\u00e9\n" tail"#, 8),
            (r#"{\"pip\": [\"x\"]}", "#, 18),
            // Escapes that decode to the longest characters: 3 bytes, and 4 from a pair.
            (r#"\u20ac\ud83d\ude00é" tail"#, 20),
            // No closing quote: the rest, even after a trailing backslash.
            (r#"open"#, 4),
            (r#"open\"#, 5),
            ("cut\nhere\" tail", 3),
        ] {
            assert_eq!(quoted_length(text.as_bytes()), length, "{text}");
            // What it bounds: the unescaped text is never longer.
            let closed = text.get(..=length).filter(|sent| sent.ends_with('"'));
            if let Some(sent) = closed {
                let unescaped: String = serde_json::from_str(&format!("\"{sent}"))?;
                assert!(unescaped.len() <= length, "{text}");
            }
        }
        // The reader allocates once: `with_capacity` is exact, and any growth would double.
        let read = Reader::new(r#""a\"b""#).string();
        assert!(
            matches!(read, Some(Cow::Owned(ref text)) if text == "a\"b" && text.capacity() == 4)
        );
        Ok(())
    }

    const LIFECYCLE: &str = r#"{"eventId": "tU1N9ZUwkGs7dHXM29US4+JeIERXNuvSoRF5Gg==", "sourceType": "CORE_WORKER", "eventType": "TASK_LIFECYCLE_EVENT", "timestamp": "2026-11-22T00:09:08.960354283Z", "severity": "INFO", "sessionName": "session_x", "taskLifecycleEvent": {"taskId": "1wjvfU407iv///////////////8IAAAA", "taskAttempt": 0, "stateTransitions": [{"state": "RUNNING", "timestamp": "2026-11-22T00:09:08.960283586Z"}], "nodeId": "", "workerId": "", "workerPid": 12, "jobId": "CAAAAA==", "taskLogInfo": {"stdoutFile": "/tmp/o", "stdoutStart": "123"}}, "nodeId": "Q3truZHedwQEhxjuBfa9JP5BpVK2XSve52JF3Q==", "message": ""}"#;

    const DEFINITION: &str = r#"{"eventId": "dQEBzi0y4EjP6QekiTDg9ehywS+hYUlnKjxhbg==", "eventType": "TASK_DEFINITION_EVENT", "sessionName": "session_x", "taskDefinitionEvent": {"taskId": "1wjvfU407iv///////////////8IAAAA", "taskAttempt": 0, "taskType": "NORMAL_TASK", "language": "PYTHON", "taskFunc": {"pythonFunctionDescriptor": {"moduleName": "m", "className": "", "functionName": "f", "functionHash": "00"}}, "taskName": "f", "requiredResources": {"CPU": 1.0}, "jobId": "CAAAAA==", "refIds": {"a": "AQAAAA=="}, "serializedRuntimeEnv": "{\"pip\": [\"x\"]}", "labelSelector": {"k": "v"}, "isDetachedActor": false}}"#;

    #[test]
    fn what_serde_reads_in_its_own_way_is_read_the_same_or_left_to_it()
    -> Result<(), Box<dyn std::error::Error>> {
        let escaped = LIFECYCLE.replace("session_x", r"s\u00e9ss\ud83d\ude00\n\/");
        let repeated_resource =
            DEFINITION.replace(r#"{"CPU": 1.0}"#, r#"{"CPU": 1.0, "CPU": 2.5e0}"#);
        let emptied_ref =
            DEFINITION.replace(r#"{"a": "AQAAAA=="}"#, r#"{"a": "AQAAAA==", "a": ""}"#);
        // (text, the fast reader reads it)
        let cases: Vec<(String, bool)> = vec![
            (LIFECYCLE.to_owned(), true),
            (DEFINITION.to_owned(), true),
            // Escapes, a surrogate pair, and whitespace everywhere.
            (escaped.clone(), true),
            (
                LIFECYCLE.replace(": ", " :\n\t ").replace(", ", " ,\r\n"),
                true,
            ),
            (format!("  {LIFECYCLE}  \n"), true),
            // A later repeat of a map's name replaces it, an empty id drops it, and an id a
            // repeat replaces is never decoded.
            (repeated_resource.clone(), true),
            (emptied_ref.clone(), true),
            (
                DEFINITION.replace(r#"{"a": "AQAAAA=="}"#, r#"{"a": "%%%", "a": "AQAAAA=="}"#),
                true,
            ),
            // Numbers as serde reads them.
            (
                LIFECYCLE.replace(r#""stdoutStart": "123""#, r#""stdoutStart": 123"#),
                true,
            ),
            (
                LIFECYCLE.replace(r#""stdoutStart": "123""#, r#""stdoutStart": "+123""#),
                true,
            ),
            (
                LIFECYCLE.replace(r#""taskAttempt": 0"#, r#""taskAttempt": -2"#),
                true,
            ),
            (
                LIFECYCLE.replace("RUNNING", "A_STATE_FROM_A_LATER_RAY"),
                true,
            ),
            // Left to serde: escaped keys, nulls, repeats, numbers not plainly integers, a
            // lone surrogate, a payload the type does not name, trailing text.
            (LIFECYCLE.replace("\"taskId\"", r#""task\u0049d""#), false),
            (
                LIFECYCLE.replace(r#""workerId": """#, r#""workerId": null"#),
                false,
            ),
            (
                LIFECYCLE.replace(r#""workerPid": 12"#, r#""workerPid": 12, "workerPid": 12"#),
                false,
            ),
            (
                LIFECYCLE.replace(r#""workerPid": 12"#, r#""workerPid": 12, "worker_pid": 12"#),
                false,
            ),
            (
                LIFECYCLE.replace(r#""workerPid": 12"#, r#""workerPid": 12.0"#),
                false,
            ),
            (
                LIFECYCLE.replace(r#""workerPid": 12"#, r#""workerPid": 012"#),
                false,
            ),
            (
                LIFECYCLE.replace(r#""workerPid": 12"#, r#""workerPid": -1"#),
                false,
            ),
            (
                LIFECYCLE.replace(r#""workerPid": 12"#, r#""workerPid": -0"#),
                false,
            ),
            (
                LIFECYCLE.replace(r#""workerPid": 12"#, r#""workerPid": "12""#),
                false,
            ),
            (
                LIFECYCLE.replace(
                    r#""stdoutStart": "123""#,
                    r#""stdoutStart": "99999999999999999999""#,
                ),
                false,
            ),
            (LIFECYCLE.replace("session_x", r"s\ud83d"), false),
            (LIFECYCLE.replace("session_x", r"s\ud800\u0041"), false),
            (
                LIFECYCLE.replace(r#""taskAttempt": 0"#, r#""taskAttempt": 1e0"#),
                false,
            ),
            (LIFECYCLE.replace("session_x", "s\u{1}"), false),
            (
                LIFECYCLE.replace("TASK_LIFECYCLE_EVENT", "TASK_DEFINITION_EVENT"),
                false,
            ),
            (
                LIFECYCLE.replace(
                    r#""message": """#,
                    r#""message": "", "taskExecutionEvent": {}"#,
                ),
                false,
            ),
            (format!("{LIFECYCLE}x"), false),
            (
                LIFECYCLE.replace(r#", "timestamp": "2026-11-22T00:09:08.960283586Z"}"#, "}"),
                false,
            ),
        ];
        for (text, fast) in &cases {
            assert_eq!(agree(text), *fast, "{text}");
        }
        // serde's readings of the cases the fast reader reads, checked by hand.
        let event = read_event(&escaped).ok_or("escapes read")?;
        assert_eq!(event.session_name, "séss\u{1f600}\n/");
        let EventPayload::TaskDefinition(definition) = read_event(&repeated_resource)
            .ok_or("a repeated resource read")?
            .payload
        else {
            return Err("a definition".into());
        };
        assert_eq!(definition.required_resources.get("CPU"), Some(&2.5));
        assert_eq!(definition.serialized_runtime_env, r#"{"pip": ["x"]}"#);
        let EventPayload::TaskDefinition(definition) = read_event(&emptied_ref)
            .ok_or("an emptied ref read")?
            .payload
        else {
            return Err("a definition".into());
        };
        assert!(definition.ref_ids.is_empty());
        Ok(())
    }
}
