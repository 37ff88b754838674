//! The `TaskSummaries` object written as JSON text: compact, keys in Ray's order, with the
//! `{state: count}` dicts and the totals both summaries end with.

/// A `{state: count}` dict, in insertion order as Python's is.
#[derive(Clone, Debug, Default)]
pub(super) struct StateCounts<'a>(pub(super) Vec<(&'a str, u64)>);

impl<'a> StateCounts<'a> {
    pub(super) fn add(&mut self, state: &'a str, count: u64) {
        match self.0.iter_mut().find(|(known, _)| *known == state) {
            Some((_, total)) => *total += count,
            None => self.0.push((state, count)),
        }
    }

    pub(super) fn get(&self, state: &str) -> u64 {
        self.0
            .iter()
            .find(|(known, _)| *known == state)
            .map_or(0, |(_, count)| *count)
    }

    pub(super) fn sum(&self, states: &[&str]) -> u64 {
        states.iter().map(|state| self.get(state)).sum()
    }

    /// `{"STATE": count, …}`, in insertion order.
    pub(super) fn write(&self, out: &mut Text) {
        out.raw("{");
        for (index, (state, count)) in self.0.iter().enumerate() {
            if index > 0 {
                out.raw(",");
            }
            out.string(state);
            out.raw(":");
            out.integer(*count);
        }
        out.raw("}");
    }
}

/// `total_tasks`, `total_actor_tasks` and `total_actor_scheduled`.
#[derive(Default)]
pub(super) struct Totals {
    tasks: u64,
    actor_tasks: u64,
    actor_scheduled: u64,
}

impl Totals {
    pub(super) fn count(&mut self, task_type: &str) {
        match task_type {
            "NORMAL_TASK" => self.tasks += 1,
            "ACTOR_CREATION_TASK" => self.actor_scheduled += 1,
            "ACTOR_TASK" => self.actor_tasks += 1,
            _ => {}
        }
    }

    /// The rest of the `TaskSummaries` object after its `summary`, keys in Ray's order.
    pub(super) fn write_after_summary(&self, out: &mut Text, summary_by: &str) {
        out.raw(",\"total_tasks\":");
        out.integer(self.tasks);
        out.raw(",\"total_actor_tasks\":");
        out.integer(self.actor_tasks);
        out.raw(",\"total_actor_scheduled\":");
        out.integer(self.actor_scheduled);
        out.raw(",\"summary_by\":");
        out.string(summary_by);
        out.raw("}");
    }
}

/// JSON text under construction: compact, keys in the order written.
#[derive(Default)]
pub(super) struct Text(pub(super) String);

impl Text {
    /// Syntax, or a key already quoted.
    pub(super) fn raw(&mut self, text: &str) {
        self.0.push_str(text);
    }

    /// A JSON string: quoted, with `"`, `\\` and control characters escaped as RFC 8259
    /// requires (everything else, non-ASCII included, is written as it is).
    pub(super) fn string(&mut self, text: &str) {
        self.0.push('"');
        let mut rest = text;
        while let Some(at) = rest.find(|c: char| c == '"' || c == '\\' || c < ' ') {
            let (plain, tail) = rest.split_at(at);
            self.0.push_str(plain);
            let mut chars = tail.chars();
            match chars.next() {
                Some('"') => self.0.push_str("\\\""),
                Some('\\') => self.0.push_str("\\\\"),
                Some('\n') => self.0.push_str("\\n"),
                Some('\r') => self.0.push_str("\\r"),
                Some('\t') => self.0.push_str("\\t"),
                Some(control) => {
                    self.0.push_str("\\u00");
                    let code = control as u32;
                    for nibble in [code >> 4, code & 0xf] {
                        self.0.push(char::from_digit(nibble, 16).unwrap_or('0'));
                    }
                }
                None => {}
            }
            rest = chars.as_str();
        }
        self.0.push_str(rest);
        self.0.push('"');
    }

    pub(super) fn integer(&mut self, value: impl itoa::Integer) {
        self.0.push_str(itoa::Buffer::new().format(value));
    }

    /// A number, or `null`.
    pub(super) fn optional(&mut self, value: Option<i64>) {
        match value {
            Some(value) => self.integer(value),
            None => self.raw("null"),
        }
    }
}
