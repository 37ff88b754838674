//! The marker lines Ray's workers write into their own stdout and stderr files, and one attempt's
//! output cut out of a range of such a file by them.
//!
//! Before each normal task it runs, a Ray 2.60 worker writes `:task_name:{name}` to both
//! streams; an actor's worker writes `:actor_name:{class}` once, before its creation task, and
//! nothing before each method call. The first task of a job on a worker is preceded by
//! `:job_id:{hex}`. Ray's log monitor reads them to prefix lines with their task; Afterglow
//! reads them where Ray reported no offsets for an attempt (see
//! [`crate::query::QueryEngine::task_log`]), so that a range inferred around several such
//! attempts is split at their markers and an attempt's answer never holds another task's lines.

/// The line that opens a normal task's output.
const TASK_NAME: &[u8] = b":task_name:";
/// The line that opens an actor's output (before its creation task).
const ACTOR_NAME: &[u8] = b":actor_name:";
/// The line before a job's first task on a worker; it opens nothing of its own.
const JOB_ID: &[u8] = b":job_id:";

/// Why an attempt's output cannot be cut out of its inferred range exactly.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unbounded {
    /// Several attempts ran in the range and no markers tell their output apart (an actor's
    /// method calls, which Ray marks with nothing).
    #[error(
        "{ran} attempts ran on the worker between the ones Ray reported offsets for, and the \
         worker wrote no marker lines between them to tell their output apart"
    )]
    NoMarkers {
        /// Attempts in the range.
        ran: usize,
    },
    /// The previous attempt's end was not reported and no marker line follows its output.
    #[error(
        "the attempt before it on the worker has no reported end, and no marker line separates \
         that attempt's output from this one's"
    )]
    PreviousUnended,
    /// The markers in the range do not match the attempts that ran there.
    #[error(
        "the worker's marker lines open {markers} tasks where the tables place {ran} attempts \
         between the ones Ray reported offsets for"
    )]
    Mismatch {
        /// Tasks the markers open.
        markers: usize,
        /// Attempts in the range.
        ran: usize,
    },
    /// Attempts of the same name ran in the range, and Ray's events do not tell their order.
    #[error(
        "{ran} attempts of the same name ran on the worker between the ones Ray reported offsets \
         for, and Ray's events do not tell in which order"
    )]
    Unordered {
        /// Attempts of the asked one's name in the range.
        ran: usize,
    },
}

/// What is known of an inferred range besides the attempts in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Known {
    /// The range starts where the previous attempt's output is known to end (or at the file's
    /// start). Otherwise that output may lead the range, and only a marker line ends it.
    pub clean_start: bool,
    /// An attempt with reported offsets starts where the range ends: its own marker lines are
    /// then the range's last lines.
    pub next_reported: bool,
    /// Every attempt in the range has the time Ray submitted it to the worker, no two the same,
    /// so the order they are given in is the order they ran.
    pub ordered: bool,
}

/// One task's part of a range: the name its marker line gave and the bytes after it.
#[derive(Debug)]
struct Section<'a> {
    /// `Some` for `:task_name:` (what it names), `None` for `:actor_name:` (a class, which
    /// names no attempt).
    task: Option<&'a [u8]>,
    body: Vec<u8>,
}

/// The bytes of `range` that attempt `asked` of `ran` wrote: `ran` names (Ray's task names,
/// what `:task_name:` carries) every attempt the tables place in the range, in the order they
/// ran there as far as `known` says it is known.
///
/// Bytes before the range's first marker are the previous attempt's when there is a marker
/// (its end was not reported); marker lines themselves are never output.
pub fn own_output(
    range: &[u8],
    ran: &[Option<String>],
    asked: usize,
    known: Known,
) -> Result<Vec<u8>, Unbounded> {
    let (lead, mut sections) = sections(range);
    if known.next_reported
        && sections
            .last()
            .is_some_and(|section| section.body.is_empty())
    {
        sections.pop();
    }
    let mismatch = Unbounded::Mismatch {
        markers: sections.len(),
        ran: ran.len(),
    };
    let Some(name) = ran.get(asked) else {
        return Err(mismatch);
    };
    let name = name.as_deref().map(str::as_bytes);
    if sections.is_empty() {
        return match (ran.len(), known.clean_start) {
            (1, true) => Ok(lead),
            (1, false) => Err(Unbounded::PreviousUnended),
            (ran, _) => Err(Unbounded::NoMarkers { ran }),
        };
    }
    let named = |section: &Section<'_>, attempt: &Option<String>| match section.task {
        Some(task) => attempt.as_deref().map(str::as_bytes) == Some(task),
        None => true,
    };
    if known.ordered
        && sections.len() == ran.len()
        && sections
            .iter()
            .zip(ran)
            .all(|(section, attempt)| named(section, attempt))
    {
        return Ok(sections.swap_remove(asked).body);
    }
    // Some attempt in the range left no marker (it never ran its code, or its markers were in
    // a part not read), or the order is not known: the asked one's name may still pick it out,
    // when the tasks of that name and their markers pair up one to one.
    let same_name = |attempt: &&Option<String>| attempt.as_deref().map(str::as_bytes) == name;
    let index = ran.iter().take(asked).filter(same_name).count();
    let attempts = ran.iter().filter(same_name).count();
    if attempts > 1 && !known.ordered {
        return Err(Unbounded::Unordered { ran: attempts });
    }
    let mut marked: Vec<Section<'_>> = sections
        .into_iter()
        .filter(|section| name.is_some() && section.task == name)
        .collect();
    if marked.len() == attempts {
        return Ok(marked.swap_remove(index).body);
    }
    Err(mismatch)
}

/// The start of `range` up to the first line that opens another task (`:task_name:`,
/// `:actor_name:`): an attempt's output from its reported start when its end was not reported.
pub fn before_next_task(range: &[u8]) -> Vec<u8> {
    sections(range).0
}

/// `range` split at its `:task_name:`/`:actor_name:` lines: what precedes the first, and each
/// marked section; `:job_id:` lines are dropped wherever they are.
fn sections(range: &[u8]) -> (Vec<u8>, Vec<Section<'_>>) {
    let mut lead = Vec::new();
    let mut sections: Vec<Section<'_>> = Vec::new();
    for line in range.split_inclusive(|byte| *byte == b'\n') {
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        // A marker is a whole line Ray wrote; a last line without its newline may be one cut
        // short, but then it opens nothing that was shipped.
        let complete = line.ends_with(b"\n");
        if complete && text.starts_with(JOB_ID) {
            continue;
        }
        if complete && let Some(task) = text.strip_prefix(TASK_NAME) {
            sections.push(Section {
                task: Some(task),
                body: Vec::new(),
            });
            continue;
        }
        if complete && text.starts_with(ACTOR_NAME) {
            sections.push(Section {
                task: None,
                body: Vec::new(),
            });
            continue;
        }
        match sections.last_mut() {
            Some(section) => section.body.extend_from_slice(line),
            None => lead.extend_from_slice(line),
        }
    }
    (lead, sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Ray 2.60 worker's `.out` file as written (captured from `ray start` on one node):
    /// `prints(i)` printing `printer {i} out` for i in 1..=5, then `prints.options(name=
    /// "custom-1")`.
    const WORKER_OUT: &[u8] = b":job_id:01000000\n:task_name:prints\nprinter 1 out\n\
        :task_name:prints\nprinter 2 out\n:task_name:prints\nprinter 3 out\n\
        :task_name:prints\nprinter 4 out\n:task_name:prints\nprinter 5 out\n\
        :task_name:custom-1\nprinter 1 out\n";

    /// A range between two attempts with reported ends, its attempts in a known order.
    const KNOWN: Known = Known {
        clean_start: true,
        next_reported: false,
        ordered: true,
    };

    fn ran(names: &[&str]) -> Vec<Option<String>> {
        names.iter().map(|name| Some((*name).to_owned())).collect()
    }

    fn text(result: Result<Vec<u8>, Unbounded>) -> Result<String, Unbounded> {
        result.map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    }

    #[test]
    fn each_attempt_in_a_range_gets_its_own_lines() {
        let names = ["prints", "prints", "prints", "prints", "prints", "custom-1"];
        let printed = [
            "printer 1 out\n",
            "printer 2 out\n",
            "printer 3 out\n",
            "printer 4 out\n",
            "printer 5 out\n",
            "printer 1 out\n",
        ];
        for (asked, expected) in printed.iter().enumerate() {
            assert_eq!(
                text(own_output(WORKER_OUT, &ran(&names), asked, KNOWN)),
                Ok((*expected).to_owned())
            );
        }
    }

    #[test]
    fn the_next_reported_attempts_markers_and_the_previous_ones_tail_are_left_out() {
        // The range runs from the previous attempt's start (its end unknown) to the start of
        // the next one's output, after that one's markers.
        let range = b"previous task's line\n:task_name:mine\nmy line\n:job_id:02000000\n\
                      :task_name:next\n";
        assert_eq!(
            text(own_output(
                range,
                &ran(&["mine"]),
                0,
                Known {
                    clean_start: false,
                    next_reported: true,
                    ..KNOWN
                }
            )),
            Ok("my line\n".to_owned())
        );
    }

    #[test]
    fn an_attempt_that_left_no_marker_is_skipped_by_name() {
        // `other` ran no code (its markers are missing); `mine` is the only one of its name.
        let range = b":task_name:first\none\n:task_name:mine\ntwo\n";
        assert_eq!(
            text(own_output(
                range,
                &ran(&["first", "other", "mine"]),
                2,
                KNOWN
            )),
            Ok("two\n".to_owned())
        );
        // Two unmarked attempts of the asked name cannot be told apart.
        let range = b":task_name:first\none\n:task_name:mine\ntwo\n";
        assert_eq!(
            own_output(range, &ran(&["first", "mine", "mine"]), 1, KNOWN),
            Err(Unbounded::Mismatch { markers: 2, ran: 3 })
        );
    }

    #[test]
    fn without_markers_only_a_lone_attempt_has_the_range() {
        let range = b"actor m 1\nactor m 2\n";
        assert_eq!(
            text(own_output(range, &ran(&["A.m"]), 0, KNOWN)),
            Ok("actor m 1\nactor m 2\n".to_owned())
        );
        assert_eq!(
            own_output(range, &ran(&["A.m", "A.m"]), 1, KNOWN),
            Err(Unbounded::NoMarkers { ran: 2 })
        );
    }

    #[test]
    fn an_actors_marker_opens_its_creation_tasks_output() {
        let range = b":job_id:01000000\n:actor_name:A\ncreated\n";
        assert_eq!(
            text(own_output(range, &ran(&["A.__init__"]), 0, KNOWN)),
            Ok("created\n".to_owned())
        );
    }

    #[test]
    fn a_line_that_only_mentions_a_marker_is_output() {
        let range = b":task_name:mine\nsays :task_name: in a line\nno newline";
        assert_eq!(
            text(own_output(range, &ran(&["mine"]), 0, KNOWN)),
            Ok("says :task_name: in a line\nno newline".to_owned())
        );
    }

    #[test]
    fn without_a_known_order_only_a_name_alone_in_the_range_is_told_apart() {
        let unordered = Known {
            ordered: false,
            ..KNOWN
        };
        let range = b":task_name:a\none\n:task_name:b\ntwo\n:task_name:a\nthree\n";
        assert_eq!(
            text(own_output(range, &ran(&["a", "b", "a"]), 1, unordered)),
            Ok("two\n".to_owned())
        );
        assert_eq!(
            own_output(range, &ran(&["a", "b", "a"]), 2, unordered),
            Err(Unbounded::Unordered { ran: 2 })
        );
    }

    #[test]
    fn a_previous_attempt_without_an_end_is_never_output() {
        let range = b"the previous attempt's line\nmine\n";
        let unended = Known {
            clean_start: false,
            ..KNOWN
        };
        assert_eq!(
            own_output(range, &ran(&["A.m"]), 0, unended),
            Err(Unbounded::PreviousUnended)
        );
    }

    #[test]
    fn a_reported_start_without_an_end_runs_to_the_next_task() {
        assert_eq!(
            before_next_task(b"mine\nmore\n:job_id:02000000\n:task_name:next\nnot mine\n"),
            b"mine\nmore\n".to_vec()
        );
        assert_eq!(
            before_next_task(b"mine, to the end"),
            b"mine, to the end".to_vec()
        );
    }
}
