//! Ray 2.60's task summaries (`GET api/v0/tasks/summarize`), ported from
//! `TaskSummaries.to_summary_by_func_name` and `TaskSummaries.to_summary_by_lineage`
//! (`ray/util/state/common.py`): the same groups, counts, timestamps and order.
//!
//! It owns only the summarizing: rows in, the `TaskSummaries` object out. It is pure: no I/O,
//! no clock, no SQL. Choosing, filtering and ordering the rows (Ray passes `list_tasks` output,
//! sorted by task id) and the response envelope belong to the caller.
//!
//! # Layout
//!
//! [`by_func_name`] is here; [`by_lineage`] and its tree are in `lineage.rs`; both write the
//! object as JSON text with `text.rs`.
//!
//! # Depth
//!
//! Ray's lineage code recurses once per tree level, so a chain of about a thousand nested
//! tasks makes it raise `RecursionError` (the dashboard answers 500). Here every step is
//! iterative: building the tree walks a parent chain with an explicit list, and grouping,
//! totalling and writing visit the nodes with explicit stacks. Stack use is constant in the
//! depth, and a chain of 100 000 nested tasks is summarized like any other tree.
//!
//! That is also why the summaries are JSON *text*, written here, and not `serde_json::Value`s:
//! a `Value` is as deep as the tree, and its `Drop` and `Serialize` recurse (serde-rs/json#440),
//! so a deep enough one overflows a tokio worker's stack, and a stack overflow aborts the
//! process. Writing the text directly also skips building a second tree of maps.
//!
//! # Deliberate differences from Ray
//!
//! Where Ray raises (and the dashboard answers 500), this module answers instead: lineages a
//! thousand or more levels deep (above); a task type that is not a `TaskType` name, which is
//! counted in no total; an actor with neither `repr_name` nor `class_name`, which is named
//! `""`; an actor link with no actor id, which has `"id": null`.

mod lineage;
#[cfg(test)]
mod tests;
mod text;

use std::collections::HashMap;

use serde::Deserialize;

pub use self::lineage::by_lineage;
use self::text::{StateCounts, Text, Totals};

/// One task attempt as Ray's summaries read it (a detail row of `api/v0/tasks`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct SummaryTask {
    /// The task id (hex).
    pub task_id: String,
    /// The name given at submission; may be empty, and then `func_or_class_name` is shown.
    pub name: String,
    /// The function, or `Class.method`.
    pub func_or_class_name: String,
    /// `NORMAL_TASK`, `ACTOR_CREATION_TASK`, `ACTOR_TASK` or `DRIVER_TASK`.
    pub task_type: String,
    /// The attempt's state (a `TaskStatus` name).
    pub state: String,
    /// The actor an actor task runs on, or an actor creation task creates.
    pub actor_id: Option<String>,
    /// The task that submitted this one; a driver's id starts with 40 `f`s.
    pub parent_task_id: Option<String>,
    /// When the task was created, in milliseconds since the epoch.
    pub creation_time_ms: Option<i64>,
}

/// An actor as the lineage summary reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryActor {
    /// The actor id (hex).
    pub actor_id: String,
    /// The actor's `__repr__` name; shown instead of the class name when not empty.
    pub repr_name: Option<String>,
    /// The actor's class name.
    pub class_name: Option<String>,
}

/// `summary_by=func_name`: the `TaskSummaries` object (`{"summary": {...}, "total_tasks",
/// "total_actor_tasks", "total_actor_scheduled", "summary_by": "func_name"}`) as JSON text, over
/// `tasks` in the order given (the caller passes task_id order).
///
/// Each task is grouped under its name, or its `func_or_class_name` when the name is empty; a
/// group's `type` is that of the first task seen in it. Every attempt counts, once in its
/// group's `state_counts` and once in the total for its type.
pub fn by_func_name(tasks: &[SummaryTask]) -> String {
    let mut groups: Vec<(&str, &str, StateCounts<'_>)> = Vec::new();
    let mut group_of_key: HashMap<&str, usize> = HashMap::new();
    let mut totals = Totals::default();
    for task in tasks {
        let key = display_name(task);
        let group = *group_of_key.entry(key).or_insert_with(|| {
            groups.push((key, &task.task_type, StateCounts::default()));
            groups.len() - 1
        });
        if let Some((_, _, counts)) = groups.get_mut(group) {
            counts.add(&task.state, 1);
        }
        totals.count(&task.task_type);
    }
    let mut out = Text::default();
    out.raw("{\"summary\":{");
    for (index, (key, task_type, counts)) in groups.iter().enumerate() {
        if index > 0 {
            out.raw(",");
        }
        out.string(key);
        out.raw(":{\"func_or_class_name\":");
        out.string(key);
        out.raw(",\"type\":");
        out.string(task_type);
        out.raw(",\"state_counts\":");
        counts.write(&mut out);
        out.raw("}");
    }
    out.raw("}");
    totals.write_after_summary(&mut out, "func_name");
    out.0
}

/// `task.get("name") or task.get("func_or_class_name")`.
pub(super) fn display_name(task: &SummaryTask) -> &str {
    if task.name.is_empty() {
        &task.func_or_class_name
    } else {
        &task.name
    }
}
