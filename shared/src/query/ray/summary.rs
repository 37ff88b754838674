//! Ray 2.60's task summaries (`GET api/v0/tasks/summarize`), ported from
//! `TaskSummaries.to_summary_by_func_name` and `TaskSummaries.to_summary_by_lineage`
//! (`ray/util/state/common.py`): the same groups, counts, timestamps and order.
//!
//! It owns only the folding: rows in, the `TaskSummaries` object out. It is pure: no I/O, no
//! clock, no SQL. Choosing, filtering and ordering the rows (Ray passes `list_tasks` output,
//! sorted by task id) and the response envelope belong to the caller.
//!
//! # Depth
//!
//! Ray's lineage code recurses once per tree level, so a chain of about a thousand nested
//! tasks makes it raise `RecursionError` (the dashboard answers 500). Here every step is
//! iterative: building the tree walks a parent chain with an explicit list, and merging,
//! totalling and writing visit the nodes with explicit stacks. Stack use is constant in the
//! depth, and a chain of 100 000 nested tasks is summarized like any other tree.
//!
//! That is also why the summaries are JSON *text*, written here, and not `serde_json::Value`s:
//! a `Value` is as deep as the tree, and its `Drop` and `Serialize` recurse (serde-rs/json#440).
//! Measured with serde_json 1.0.154 on a 2 MiB stack (a tokio worker's): dropping overflowed at
//! about 10 000 levels, serializing at about 20 000, and a stack overflow aborts the process.
//! Writing the text directly also skips building a second tree of maps.
//!
//! # Deliberate differences from Ray
//!
//! Where Ray raises (and the dashboard answers 500), this module answers instead: lineages a
//! thousand or more levels deep (above); a task type that is not a `TaskType` name, which is
//! counted in no total; an actor with neither `repr_name` nor `class_name`, which is named
//! `""`; an actor link with no actor id, which has `"id": null`.

use std::cmp::Reverse;
use std::collections::HashMap;

use serde::Deserialize;

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

/// `summary_by=lineage`: the same object, as JSON text, with `summary` a list of nested nodes
/// (`{name, key, type, timestamp, state_counts, children, link}`) and `summary_by: "lineage"`.
///
/// `tasks` are detail rows in the order Ray's `list_tasks` returns them (by task id); `actors`
/// name the actor nodes. Tasks hang under the task that submitted them, actor tasks and the
/// actor's creation task under an `ACTOR` node, and that node under the creation task's
/// parent. A task whose parent (or actor's creation task) is missing is counted in the totals
/// but left out of the tree with everything under it. Same-named siblings are folded into a
/// `GROUP` node, counts are summed upwards, and siblings are sorted by running, pending and
/// failed counts (descending), then timestamp, then actor creation tasks first.
pub fn by_lineage(tasks: &[SummaryTask], actors: &[SummaryActor]) -> String {
    let mut lineage = Lineage::new(tasks, actors);
    // Step 2: every attempt counts on its task's node, which is built (with its ancestors) on
    // first sight.
    let mut totals = Totals::default();
    for (row, task) in tasks.iter().enumerate() {
        let Some(node) = lineage.task_node(row) else {
            continue;
        };
        if let Some(node) = lineage.nodes.get_mut(node) {
            node.counts.add(&task.state, 1);
        }
        totals.count(&task.task_type);
    }
    lineage.merge_siblings_everywhere();
    lineage.total_and_sort();
    let mut out = Text::default();
    out.raw("{\"summary\":");
    lineage.write_roots(&mut out);
    totals.write_after_summary(&mut out, "lineage");
    out.0
}

/// Ray's `DRIVER_TASK_ID_PREFIX`: a parent with this prefix is a driver, so its child is a root.
const DRIVER_TASK_ID_PREFIX: &str = "ffffffffffffffffffffffffffffffffffffffff";

/// The states `get_running_tasks_count` adds up.
const RUNNING: [&str; 3] = ["RUNNING", "RUNNING_IN_RAY_GET", "RUNNING_IN_RAY_WAIT"];

/// The states `get_pending_tasks_count` adds up.
const PENDING: [&str; 4] = [
    "PENDING_ARGS_AVAIL",
    "PENDING_NODE_ASSIGNMENT",
    "PENDING_OBJ_STORE_MEM_AVAIL",
    "PENDING_ARGS_FETCH",
];

/// Below this many siblings, merging finds a name's group by scanning rather than hashing.
const SCAN_LIMIT: usize = 16;

/// `task.get("name") or task.get("func_or_class_name")`.
fn display_name(task: &SummaryTask) -> &str {
    if task.name.is_empty() {
        &task.func_or_class_name
    } else {
        &task.name
    }
}

/// The parent a task hangs under, or `None` when it is a root: no parent, an empty one, or a
/// driver.
fn submitter(parent_task_id: &Option<String>) -> Option<&str> {
    parent_task_id
        .as_deref()
        .filter(|parent| !parent.is_empty() && !parent.starts_with(DRIVER_TASK_ID_PREFIX))
}

/// Python's `x or sys.maxsize` on a timestamp: `None` and `0` are both missing.
fn or_max(timestamp: Option<i64>) -> i64 {
    match timestamp {
        Some(timestamp) if timestamp != 0 => timestamp,
        _ => i64::MAX,
    }
}

/// Python's truthiness of a timestamp.
fn truthy(timestamp: Option<i64>) -> Option<i64> {
    timestamp.filter(|timestamp| *timestamp != 0)
}

/// A `{state: count}` dict, in insertion order as Python's is.
#[derive(Clone, Debug, Default)]
struct StateCounts<'a>(Vec<(&'a str, u64)>);

impl<'a> StateCounts<'a> {
    fn add(&mut self, state: &'a str, count: u64) {
        match self.0.iter_mut().find(|(known, _)| *known == state) {
            Some((_, total)) => *total += count,
            None => self.0.push((state, count)),
        }
    }

    fn get(&self, state: &str) -> u64 {
        self.0
            .iter()
            .find(|(known, _)| *known == state)
            .map_or(0, |(_, count)| *count)
    }

    fn sum(&self, states: &[&str]) -> u64 {
        states.iter().map(|state| self.get(state)).sum()
    }

    /// `{"STATE": count, …}`, in insertion order.
    fn write(&self, out: &mut Text) {
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
struct Totals {
    tasks: u64,
    actor_tasks: u64,
    actor_scheduled: u64,
}

impl Totals {
    fn count(&mut self, task_type: &str) {
        match task_type {
            "NORMAL_TASK" => self.tasks += 1,
            "ACTOR_CREATION_TASK" => self.actor_scheduled += 1,
            "ACTOR_TASK" => self.actor_tasks += 1,
            _ => {}
        }
    }

    /// The rest of the `TaskSummaries` object after its `summary`, keys in Ray's order.
    fn write_after_summary(&self, out: &mut Text, summary_by: &str) {
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
struct Text(String);

impl Text {
    /// Syntax, or a key already quoted.
    fn raw(&mut self, text: &str) {
        self.0.push_str(text);
    }

    /// A JSON string: quoted, with `"`, `\\` and control characters escaped as RFC 8259
    /// requires (everything else, non-ASCII included, is written as it is).
    fn string(&mut self, text: &str) {
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

    fn integer(&mut self, value: impl itoa::Integer) {
        self.0.push_str(itoa::Buffer::new().format(value));
    }

    /// A number, or `null`.
    fn optional(&mut self, value: Option<i64>) {
        match value {
            Some(value) => self.integer(value),
            None => self.raw("null"),
        }
    }
}

/// A `NestedTaskSummary`'s `link`.
#[derive(Clone, Copy, Debug)]
enum Link<'a> {
    Task(&'a str),
    Actor(Option<&'a str>),
}

/// One `NestedTaskSummary` in the arena; `children` are arena indices.
#[derive(Debug)]
struct Node<'a> {
    name: &'a str,
    key: Key<'a>,
    kind: &'a str,
    timestamp: Option<i64>,
    counts: StateCounts<'a>,
    children: Vec<usize>,
    link: Option<Link<'a>>,
}

/// A node's `key`.
#[derive(Clone, Copy, Debug)]
enum Key<'a> {
    /// A task id, or a group's name.
    Plain(&'a str),
    /// `actor:{id}`, holding the id as Python formats it (`None` for a missing one).
    Actor(&'a str),
}

/// What a node hangs under, while a parent chain is being built.
enum Owner<'a> {
    /// A task id, with its slot when already known.
    Task(&'a str, Option<usize>),
    /// An actor id.
    Actor(Option<&'a str>),
}

/// A lookup in Ray's `task_group_by_id`, then in its `tasks_by_id`.
enum Found {
    /// The node exists.
    Node(usize),
    /// No node yet; the task (or the actor's creation task) has this slot.
    New(usize),
    /// The task, or the actor's creation task, is unknown.
    Missing,
}

/// Where a parent chain ends.
enum ChainEnd {
    /// The top node created is a root.
    Root,
    /// The top node created is a child of this existing node.
    Under(usize),
    /// A task or an actor's creation task is missing: the chain hangs nowhere.
    Dropped,
}

/// Where a new node is registered, so that later lookups find it.
enum Registration<'a> {
    Task(usize),
    Actor(&'a str),
}

/// The lineage tree under construction: Ray's `task_group_by_id` and `summary`, as an arena.
///
/// Each distinct task id gets a slot once, so only parent ids are hashed afterwards. Ray keeps
/// task and actor nodes in one dict (keys `task_id` and `actor:{actor_id}`); here they are two
/// maps, and lookups cross over in the one case where that dict would collide: a task id of the
/// form `actor:…`.
struct Lineage<'a> {
    tasks: &'a [SummaryTask],
    /// A slot per distinct task id.
    slot_of_id: HashMap<&'a str, usize>,
    /// Per row of `tasks`: its task's slot.
    slot_of_row: Vec<usize>,
    /// Per slot: the row of the task's last attempt (Ray's `tasks_by_id`).
    last_row: Vec<usize>,
    /// Per slot: the task's node, once built.
    node_of_slot: Vec<Option<usize>>,
    /// Ray's `actor_creation_task_id_for_actor_id`, to slots.
    creation_slot_of_actor: HashMap<Option<&'a str>, usize>,
    actor_by_id: HashMap<&'a str, &'a SummaryActor>,
    /// Actor nodes, by the id in their key (`actor:{id}`).
    node_of_actor: HashMap<&'a str, usize>,
    /// Whether some task id has the form `actor:…`.
    actor_shaped_ids: bool,
    nodes: Vec<Node<'a>>,
    roots: Vec<usize>,
    /// The nodes one `task_node` call creates (kept to reuse its allocation).
    chain: Vec<usize>,
}

impl<'a> Lineage<'a> {
    /// Step 1: index the tasks (a later attempt replaces an earlier one), the actors' creation
    /// tasks and the actors.
    fn new(tasks: &'a [SummaryTask], actors: &'a [SummaryActor]) -> Self {
        let mut slot_of_id = HashMap::with_capacity(tasks.len());
        let mut slot_of_row = Vec::with_capacity(tasks.len());
        let mut last_row = Vec::with_capacity(tasks.len());
        let mut creation_slot_of_actor = HashMap::new();
        let mut actor_shaped_ids = false;
        for (row, task) in tasks.iter().enumerate() {
            let slot = *slot_of_id.entry(task.task_id.as_str()).or_insert_with(|| {
                actor_shaped_ids |= task.task_id.starts_with("actor:");
                last_row.push(row);
                last_row.len() - 1
            });
            if let Some(last) = last_row.get_mut(slot) {
                *last = row;
            }
            slot_of_row.push(slot);
            if task.task_type == "ACTOR_CREATION_TASK" {
                creation_slot_of_actor.insert(task.actor_id.as_deref(), slot);
            }
        }
        let actor_by_id = actors
            .iter()
            .map(|actor| (actor.actor_id.as_str(), actor))
            .collect();
        Lineage {
            tasks,
            slot_of_id,
            slot_of_row,
            node_of_slot: vec![None; last_row.len()],
            last_row,
            creation_slot_of_actor,
            actor_by_id,
            node_of_actor: HashMap::new(),
            actor_shaped_ids,
            nodes: Vec::with_capacity(tasks.len()),
            roots: Vec::new(),
            chain: Vec::new(),
        }
    }

    /// The task whose last attempt is in `slot`.
    fn task_in(&self, slot: usize) -> Option<&'a SummaryTask> {
        let tasks: &'a [SummaryTask] = self.tasks;
        self.last_row.get(slot).and_then(|&row| tasks.get(row))
    }

    /// `get_or_create_task_group`'s lookups for `task_id` (whose slot may be known).
    fn find_task(&self, task_id: &str, slot: Option<usize>) -> Found {
        if let Some(actor) = task_id.strip_prefix("actor:")
            && let Some(&node) = self.node_of_actor.get(actor)
        {
            return Found::Node(node);
        }
        let Some(slot) = slot.or_else(|| self.slot_of_id.get(task_id).copied()) else {
            return Found::Missing;
        };
        match self.node_of_slot.get(slot) {
            Some(Some(node)) => Found::Node(*node),
            Some(None) => Found::New(slot),
            None => Found::Missing,
        }
    }

    /// `get_or_create_actor_task_group`'s lookups for the actor `key_id` (as in its key); `New`
    /// holds the slot of the actor's creation task.
    fn find_actor(&self, actor_id: Option<&str>, key_id: &str) -> Found {
        if let Some(&node) = self.node_of_actor.get(key_id) {
            return Found::Node(node);
        }
        if self.actor_shaped_ids
            && let Some(&slot) = self.slot_of_id.get(format!("actor:{key_id}").as_str())
            && let Some(Some(node)) = self.node_of_slot.get(slot)
        {
            return Found::Node(*node);
        }
        match self.creation_slot_of_actor.get(&actor_id) {
            Some(&slot) => Found::New(slot),
            None => Found::Missing,
        }
    }

    /// Ray's `get_or_create_task_group` (with `get_or_create_actor_task_group`) for the task of
    /// `row`, without recursion: create the task's node and each missing ancestor, walking up
    /// until an existing node, a root or a missing task, then attach them in the order Ray's
    /// recursion unwinds (deepest first). A new actor node takes the creation time of the row
    /// being counted, as Ray's does.
    ///
    /// A task whose ancestry is broken still gets a node, detached from the tree.
    fn task_node(&mut self, row: usize) -> Option<usize> {
        let tasks: &'a [SummaryTask] = self.tasks;
        let counted = tasks.get(row)?;
        let mut created = std::mem::take(&mut self.chain);
        created.clear();
        let mut next = Owner::Task(&counted.task_id, self.slot_of_row.get(row).copied());
        let end = loop {
            let (node, owner, registration) = match next {
                Owner::Task(task_id, slot) => {
                    let slot = match self.find_task(task_id, slot) {
                        Found::Node(node) => break ChainEnd::Under(node),
                        Found::Missing => break ChainEnd::Dropped,
                        Found::New(slot) => slot,
                    };
                    let Some(task) = self.task_in(slot) else {
                        break ChainEnd::Dropped;
                    };
                    let owner = match task.task_type.as_str() {
                        "ACTOR_TASK" | "ACTOR_CREATION_TASK" => {
                            Some(Owner::Actor(task.actor_id.as_deref()))
                        }
                        _ => submitter(&task.parent_task_id).map(|id| Owner::Task(id, None)),
                    };
                    let node = Node {
                        name: display_name(task),
                        key: Key::Plain(&task.task_id),
                        kind: &task.task_type,
                        timestamp: task.creation_time_ms,
                        counts: StateCounts::default(),
                        children: Vec::new(),
                        link: Some(Link::Task(&task.task_id)),
                    };
                    (node, owner, Registration::Task(slot))
                }
                Owner::Actor(actor_id) => {
                    // Python's f"actor:{actor_id}" writes None as "None".
                    let key_id = actor_id.unwrap_or("None");
                    let slot = match self.find_actor(actor_id, key_id) {
                        Found::Node(node) => break ChainEnd::Under(node),
                        Found::Missing => break ChainEnd::Dropped,
                        Found::New(slot) => slot,
                    };
                    let Some(creation_task) = self.task_in(slot) else {
                        break ChainEnd::Dropped;
                    };
                    let name = match actor_id.and_then(|id| self.actor_by_id.get(id)) {
                        Some(actor) => actor
                            .repr_name
                            .as_deref()
                            .filter(|name| !name.is_empty())
                            .or(actor.class_name.as_deref())
                            .unwrap_or_default(),
                        None => {
                            let class = creation_task.func_or_class_name.as_str();
                            class.split_once('.').map_or(class, |(head, _)| head)
                        }
                    };
                    let owner =
                        submitter(&creation_task.parent_task_id).map(|id| Owner::Task(id, None));
                    let node = Node {
                        name,
                        key: Key::Actor(key_id),
                        kind: "ACTOR",
                        timestamp: counted.creation_time_ms,
                        counts: StateCounts::default(),
                        children: Vec::new(),
                        link: Some(Link::Actor(actor_id)),
                    };
                    (node, owner, Registration::Actor(key_id))
                }
            };
            let index = self.nodes.len();
            self.nodes.push(node);
            match registration {
                Registration::Task(slot) => {
                    if let Some(entry) = self.node_of_slot.get_mut(slot) {
                        *entry = Some(index);
                    }
                }
                Registration::Actor(key_id) => {
                    self.node_of_actor.insert(key_id, index);
                }
            }
            created.push(index);
            match owner {
                Some(owner) => next = owner,
                None => break ChainEnd::Root,
            }
        };
        if let Some(&top) = created.last() {
            match end {
                ChainEnd::Root => self.roots.push(top),
                ChainEnd::Under(parent) => self.adopt(parent, top),
                ChainEnd::Dropped => {}
            }
        }
        for pair in created.windows(2).rev() {
            if let [child, parent] = *pair {
                self.adopt(parent, child);
            }
        }
        let found = match (created.first(), end) {
            (Some(&first), _) => Some(first),
            (None, ChainEnd::Under(existing)) => Some(existing),
            (None, _) => None,
        };
        self.chain = created;
        found
    }

    fn adopt(&mut self, parent: usize, child: usize) {
        if let Some(parent) = self.nodes.get_mut(parent) {
            parent.children.push(child);
        }
    }

    /// The nodes reachable from `roots`, children before parents. Each reachable node has one
    /// parent and none lies on a cycle (a parent cycle is never reachable from a root), so
    /// this is a tree walk; `seen` only guards against looping regardless.
    fn post_order(&self, roots: &[usize]) -> Vec<usize> {
        let mut order = Vec::with_capacity(self.nodes.len());
        let mut seen = vec![false; self.nodes.len()];
        let mut stack: Vec<(usize, bool)> = roots.iter().rev().map(|&root| (root, false)).collect();
        while let Some((index, expanded)) = stack.pop() {
            if expanded {
                order.push(index);
                continue;
            }
            match seen.get_mut(index) {
                Some(seen) if !*seen => *seen = true,
                _ => continue,
            }
            stack.push((index, true));
            if let Some(node) = self.nodes.get(index) {
                stack.extend(node.children.iter().rev().map(|&child| (child, false)));
            }
        }
        order
    }

    /// Calls `visit` with each node that has children and its children (taken out of the
    /// node, put back after), children before parents; then with the roots (`None`).
    fn bottom_up(&mut self, mut visit: impl FnMut(&mut Self, Option<usize>, &mut Vec<usize>)) {
        for index in self.post_order(&self.roots) {
            let Some(node) = self.nodes.get_mut(index) else {
                continue;
            };
            if node.children.is_empty() {
                continue;
            }
            let mut children = std::mem::take(&mut node.children);
            visit(self, Some(index), &mut children);
            if let Some(node) = self.nodes.get_mut(index) {
                node.children = children;
            }
        }
        let mut roots = std::mem::take(&mut self.roots);
        visit(self, None, &mut roots);
        self.roots = roots;
    }

    /// Step 3 (`merge_sibings_for_task_group`), bottom-up: each node's children are merged
    /// after their own children were, and a node takes its subtree's earliest timestamp when
    /// that is earlier than its own; then the roots are merged.
    fn merge_siblings_everywhere(&mut self) {
        self.bottom_up(|lineage, index, children| {
            let earliest = lineage.merge_siblings(children);
            if let Some(node) = index.and_then(|index| lineage.nodes.get_mut(index))
                && let Some(earliest) = truthy(earliest)
                && earliest < or_max(node.timestamp)
            {
                node.timestamp = Some(earliest);
            }
        });
    }

    /// Folds siblings that share a name into a `GROUP` node (kept where the first of them
    /// was); a name held by one sibling keeps the sibling itself. Returns the earliest truthy
    /// timestamp among the siblings, as Ray computes it.
    fn merge_siblings(&mut self, siblings: &mut Vec<usize>) -> Option<i64> {
        struct Group<'a> {
            name: &'a str,
            first: usize,
            size: usize,
            timestamp: Option<i64>,
            node: Option<usize>,
        }
        let mut groups: Vec<Group<'a>> = Vec::new();
        let mut group_of_name: HashMap<&'a str, usize> = HashMap::new();
        let mut group_of_sibling = Vec::with_capacity(siblings.len());
        let mut earliest = None;
        let scan = siblings.len() <= SCAN_LIMIT;
        for &child in siblings.iter() {
            let (name, timestamp) = match self.nodes.get(child) {
                Some(node) => (node.name, node.timestamp),
                None => ("", None),
            };
            let found = if scan {
                groups.iter().position(|group| group.name == name)
            } else {
                group_of_name.get(name).copied()
            };
            let index = found.unwrap_or_else(|| {
                groups.push(Group {
                    name,
                    first: child,
                    size: 0,
                    timestamp: None,
                    node: None,
                });
                if !scan {
                    group_of_name.insert(name, groups.len() - 1);
                }
                groups.len() - 1
            });
            group_of_sibling.push(index);
            let Some(group) = groups.get_mut(index) else {
                continue;
            };
            group.size += 1;
            if let Some(timestamp) = truthy(timestamp)
                && timestamp < or_max(group.timestamp)
            {
                group.timestamp = Some(timestamp);
                if timestamp < or_max(earliest) {
                    earliest = Some(timestamp);
                }
            }
        }
        if groups.len() == siblings.len() {
            return earliest; // every name is unique: nothing to fold
        }
        for group in groups.iter_mut().filter(|group| group.size > 1) {
            group.node = Some(self.nodes.len());
            self.nodes.push(Node {
                name: group.name,
                key: Key::Plain(group.name),
                kind: "GROUP",
                timestamp: group.timestamp,
                counts: StateCounts::default(),
                children: Vec::with_capacity(group.size),
                link: None,
            });
        }
        for (&child, &group) in siblings.iter().zip(&group_of_sibling) {
            if let Some(node) = groups.get(group).and_then(|group| group.node) {
                self.adopt(node, child);
            }
        }
        *siblings = groups
            .iter()
            .map(|group| group.node.unwrap_or(group.first))
            .collect();
        earliest
    }

    /// Step 4 (`calc_total_for_task_group`, `sort_task_groups`), bottom-up: a node adds its
    /// children's counts (in merged order) after its own, then sorts its children; then the
    /// roots are sorted.
    fn total_and_sort(&mut self) {
        self.bottom_up(|lineage, index, children| {
            if let Some(index) = index {
                let mut counts = lineage
                    .nodes
                    .get_mut(index)
                    .map(|node| std::mem::take(&mut node.counts))
                    .unwrap_or_default();
                for &child in children.iter() {
                    if let Some(child) = lineage.nodes.get(child) {
                        for &(state, count) in &child.counts.0 {
                            counts.add(state, count);
                        }
                    }
                }
                if let Some(node) = lineage.nodes.get_mut(index) {
                    node.counts = counts;
                }
            }
            lineage.sort(children);
        });
    }

    /// The roots as a JSON list of `NestedTaskSummary`s (`dataclasses.asdict` order), written
    /// depth-first with an explicit stack.
    fn write_roots(&self, out: &mut Text) {
        enum Step {
            Open(usize),
            Close(usize),
            Comma,
        }
        /// Pushes `siblings` so that they pop first to last, with commas between.
        fn push_siblings(steps: &mut Vec<Step>, siblings: &[usize]) {
            for (position, &sibling) in siblings.iter().enumerate().rev() {
                steps.push(Step::Open(sibling));
                if position > 0 {
                    steps.push(Step::Comma);
                }
            }
        }
        out.raw("[");
        let mut steps = Vec::new();
        push_siblings(&mut steps, &self.roots);
        while let Some(step) = steps.pop() {
            match step {
                Step::Comma => out.raw(","),
                Step::Open(index) => {
                    let Some(node) = self.nodes.get(index) else {
                        out.raw("null");
                        continue;
                    };
                    out.raw("{\"name\":");
                    out.string(node.name);
                    out.raw(",\"key\":");
                    match node.key {
                        Key::Plain(key) => out.string(key),
                        Key::Actor(id) => out.string(&format!("actor:{id}")),
                    }
                    out.raw(",\"type\":");
                    out.string(node.kind);
                    out.raw(",\"timestamp\":");
                    out.optional(node.timestamp);
                    out.raw(",\"state_counts\":");
                    node.counts.write(out);
                    out.raw(",\"children\":[");
                    steps.push(Step::Close(index));
                    push_siblings(&mut steps, &node.children);
                }
                Step::Close(index) => {
                    out.raw("],\"link\":");
                    match self.nodes.get(index).and_then(|node| node.link) {
                        Some(Link::Task(id)) => {
                            out.raw("{\"type\":\"task\",\"id\":");
                            out.string(id);
                            out.raw("}");
                        }
                        Some(Link::Actor(id)) => {
                            out.raw("{\"type\":\"actor\",\"id\":");
                            match id {
                                Some(id) => out.string(id),
                                None => out.raw("null"),
                            }
                            out.raw("}");
                        }
                        None => out.raw("null"),
                    }
                    out.raw("}");
                }
            }
        }
        out.raw("]");
    }

    /// `sort_task_groups`: Ray's five successive stable sorts are one stable sort on this key.
    fn sort(&self, siblings: &mut [usize]) {
        if siblings.len() < 2 {
            return;
        }
        siblings.sort_by_cached_key(|&index| {
            self.nodes.get(index).map(|node| {
                (
                    Reverse(node.counts.sum(&RUNNING)),
                    Reverse(node.counts.sum(&PENDING)),
                    Reverse(node.counts.get("FAILED")),
                    or_max(node.timestamp),
                    node.kind != "ACTOR_CREATION_TASK",
                )
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value as Json, json};

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    const DRIVER: &str = "ffffffffffffffffffffffffffffffffffffffff01000000";
    const CREATION: &str = "ACTOR_CREATION_TASK";
    const METHOD: &str = "ACTOR_TASK";

    /// A normal task named `name` (function `mod.{name}`) under `parent`.
    fn normal(id: &str, name: &str, state: &str, parent: &str, ts: i64) -> SummaryTask {
        SummaryTask {
            task_id: id.into(),
            name: name.into(),
            func_or_class_name: format!("mod.{name}"),
            task_type: "NORMAL_TASK".into(),
            state: state.into(),
            actor_id: None,
            parent_task_id: Some(parent.into()),
            creation_time_ms: Some(ts),
        }
    }

    /// An actor creation task or actor task of `actor`, submitted by the driver.
    fn on_actor(
        id: &str,
        name: &str,
        kind: &str,
        state: &str,
        actor: &str,
        ts: i64,
    ) -> SummaryTask {
        SummaryTask {
            task_id: id.into(),
            name: name.into(),
            func_or_class_name: name.into(),
            task_type: kind.into(),
            state: state.into(),
            actor_id: Some(actor.into()),
            parent_task_id: Some(DRIVER.into()),
            creation_time_ms: Some(ts),
        }
    }

    fn link(kind: &str, id: &str) -> Json {
        json!({"type": kind, "id": id})
    }

    /// The summary's text, parsed.
    fn parsed(text: &str) -> Result<Json, serde_json::Error> {
        serde_json::from_str(text)
    }

    #[test]
    fn lineage_matches_the_captured_ray_vector() -> TestResult {
        // Spec §3.3's test vector, in its order.
        let tasks = [
            normal("t1", "f", "FINISHED", DRIVER, 100),
            normal("t2", "f", "RUNNING", DRIVER, 50),
            normal("t3", "g", "FAILED", "t1", 200),
            on_actor("ac", "A.__init__", CREATION, "FINISHED", "a1", 10),
            on_actor("m1", "A.m", METHOD, "FINISHED", "a1", 300),
            on_actor("m2", "A.m", METHOD, "FINISHED", "a1", 5),
            normal("orph", "h", "FINISHED", "missing", 1),
            normal("x1", "k", "PENDING_NODE_ASSIGNMENT", "m1", 400),
        ];
        let actors = [SummaryActor {
            actor_id: "a1".into(),
            repr_name: Some(String::new()),
            class_name: Some("A".into()),
        }];
        let expected = json!({
            "summary": [
                {"name": "f", "key": "f", "type": "GROUP", "timestamp": 50,
                 "state_counts": {"FINISHED": 1, "FAILED": 1, "RUNNING": 1}, "link": null,
                 "children": [
                    {"name": "f", "key": "t2", "type": "NORMAL_TASK", "timestamp": 50,
                     "state_counts": {"RUNNING": 1}, "children": [], "link": link("task", "t2")},
                    {"name": "f", "key": "t1", "type": "NORMAL_TASK", "timestamp": 100,
                     "state_counts": {"FINISHED": 1, "FAILED": 1}, "link": link("task", "t1"),
                     "children": [
                        {"name": "g", "key": "t3", "type": "NORMAL_TASK", "timestamp": 200,
                         "state_counts": {"FAILED": 1}, "children": [],
                         "link": link("task", "t3")}]}]},
                {"name": "A", "key": "actor:a1", "type": "ACTOR", "timestamp": 5,
                 "state_counts": {"FINISHED": 3, "PENDING_NODE_ASSIGNMENT": 1},
                 "link": link("actor", "a1"),
                 "children": [
                    {"name": "A.m", "key": "A.m", "type": "GROUP", "timestamp": 5,
                     "state_counts": {"FINISHED": 2, "PENDING_NODE_ASSIGNMENT": 1}, "link": null,
                     "children": [
                        {"name": "A.m", "key": "m1", "type": "ACTOR_TASK", "timestamp": 300,
                         "state_counts": {"FINISHED": 1, "PENDING_NODE_ASSIGNMENT": 1},
                         "link": link("task", "m1"),
                         "children": [
                            {"name": "k", "key": "x1", "type": "NORMAL_TASK", "timestamp": 400,
                             "state_counts": {"PENDING_NODE_ASSIGNMENT": 1}, "children": [],
                             "link": link("task", "x1")}]},
                        {"name": "A.m", "key": "m2", "type": "ACTOR_TASK", "timestamp": 5,
                         "state_counts": {"FINISHED": 1}, "children": [],
                         "link": link("task", "m2")}]},
                    {"name": "A.__init__", "key": "ac", "type": "ACTOR_CREATION_TASK",
                     "timestamp": 10, "state_counts": {"FINISHED": 1}, "children": [],
                     "link": link("task", "ac")}]}],
            "total_tasks": 5,
            "total_actor_tasks": 2,
            "total_actor_scheduled": 1,
            "summary_by": "lineage",
        });
        assert_eq!(parsed(&by_lineage(&tasks, &actors))?, expected);
        Ok(())
    }

    #[test]
    fn func_name_groups_by_name_or_function_with_the_first_type_seen() -> TestResult {
        let mut unnamed = normal("01", "", "FINISHED", DRIVER, 1);
        unnamed.func_or_class_name = "mod.train".into();
        let mut driver = normal("06", "", "RUNNING", "", 6);
        driver.task_type = "DRIVER_TASK".into();
        driver.func_or_class_name = "main".into();
        let tasks = [
            unnamed,
            // Named like the function above: same group.
            normal("02", "mod.train", "FAILED", DRIVER, 2),
            // An actor task first under "step", then a normal task of that name.
            on_actor("03", "step", METHOD, "RUNNING", "a", 3),
            normal("04", "step", "FINISHED", "03", 4),
            on_actor("05", "A.__init__", CREATION, "FINISHED", "a", 5),
            driver,
            normal("07", "step", "RUNNING", "03", 7),
        ];
        let expected = json!({
            "summary": {
                "mod.train": {"func_or_class_name": "mod.train", "type": "NORMAL_TASK",
                              "state_counts": {"FINISHED": 1, "FAILED": 1}},
                "step": {"func_or_class_name": "step", "type": "ACTOR_TASK",
                         "state_counts": {"RUNNING": 2, "FINISHED": 1}},
                "A.__init__": {"func_or_class_name": "A.__init__", "type": "ACTOR_CREATION_TASK",
                               "state_counts": {"FINISHED": 1}},
                "main": {"func_or_class_name": "main", "type": "DRIVER_TASK",
                         "state_counts": {"RUNNING": 1}},
            },
            "total_tasks": 4,
            "total_actor_tasks": 1,
            "total_actor_scheduled": 1,
            "summary_by": "func_name",
        });
        assert_eq!(parsed(&by_func_name(&tasks))?, expected);
        assert_eq!(
            parsed(&by_func_name(&[]))?,
            json!({"summary": {}, "total_tasks": 0, "total_actor_tasks": 0,
                   "total_actor_scheduled": 0, "summary_by": "func_name"})
        );
        Ok(())
    }

    #[test]
    fn missing_parent_drops_the_subtree_but_counts_it() -> TestResult {
        let tasks = [
            normal("a", "orphan", "FINISHED", "gone", 1),
            normal("b", "grandchild", "RUNNING", "a", 2),
            normal("c", "kept", "FAILED", DRIVER, 3),
            normal("c", "kept", "FINISHED", DRIVER, 3),
        ];
        let expected = json!({
            "summary": [
                {"name": "kept", "key": "c", "type": "NORMAL_TASK", "timestamp": 3,
                 "state_counts": {"FAILED": 1, "FINISHED": 1}, "children": [],
                 "link": link("task", "c")}],
            "total_tasks": 4,
            "total_actor_tasks": 0,
            "total_actor_scheduled": 0,
            "summary_by": "lineage",
        });
        assert_eq!(parsed(&by_lineage(&tasks, &[]))?, expected);
        Ok(())
    }

    #[test]
    fn actor_without_creation_task_is_dropped_but_counted() -> TestResult {
        let tasks = [
            on_actor("m1", "B.m", METHOD, "FINISHED", "b1", 1),
            on_actor("m2", "B.m", METHOD, "FINISHED", "b1", 2),
            normal("n1", "under_m1", "FINISHED", "m1", 3),
        ];
        let actors = [SummaryActor {
            actor_id: "b1".into(),
            repr_name: None,
            class_name: Some("B".into()),
        }];
        let expected = json!({
            "summary": [],
            "total_tasks": 1,
            "total_actor_tasks": 2,
            "total_actor_scheduled": 0,
            "summary_by": "lineage",
        });
        assert_eq!(parsed(&by_lineage(&tasks, &actors))?, expected);
        Ok(())
    }

    #[test]
    fn a_chain_of_100_000_nested_tasks_is_written_without_overflowing_the_stack() {
        use std::fmt::Write as _;
        const DEPTH: usize = 100_000;
        let id = |i: usize| format!("{i:08}");
        // Deepest first, so the first task counted builds the whole chain in one call.
        let tasks: Vec<SummaryTask> = (0..DEPTH)
            .rev()
            .map(|i| {
                let parent = if i == 0 { DRIVER.to_owned() } else { id(i - 1) };
                normal(&id(i), "nested", "FINISHED", &parent, 10 + i as i64)
            })
            .collect();
        // Everything below counts upwards; the earliest timestamp is each level's own. A
        // `Value` this deep could not even be dropped, so the text is compared as text.
        let mut expected = String::from("{\"summary\":[");
        for level in 0..DEPTH {
            let _ = write!(
                expected,
                "{{\"name\":\"nested\",\"key\":\"{}\",\"type\":\"NORMAL_TASK\",\
                 \"timestamp\":{},\"state_counts\":{{\"FINISHED\":{}}},\"children\":[",
                id(level),
                10 + level,
                DEPTH - level
            );
        }
        for level in (0..DEPTH).rev() {
            let _ = write!(
                expected,
                "],\"link\":{{\"type\":\"task\",\"id\":\"{}\"}}}}",
                id(level)
            );
        }
        let _ = write!(
            expected,
            "],\"total_tasks\":{DEPTH},\"total_actor_tasks\":0,\"total_actor_scheduled\":0,\
             \"summary_by\":\"lineage\"}}"
        );
        let summary = by_lineage(&tasks, &[]);
        let differs_at = summary
            .bytes()
            .zip(expected.bytes())
            .position(|(ours, theirs)| ours != theirs);
        assert!(
            summary == expected,
            "differs at byte {differs_at:?}: {:?}",
            summary
                .get(differs_at.unwrap_or(0).saturating_sub(80)..)
                .map(|tail| tail.chars().take(200).collect::<String>())
        );
    }

    #[test]
    fn names_are_escaped_as_json_strings() -> TestResult {
        let awkward = "say \"hi\"\\ \n\t\r\u{1}\u{1f}\u{7f} é 🚀 </script>";
        let mut task = normal("t", awkward, "FINISHED", DRIVER, 1);
        task.func_or_class_name = awkward.into();
        let tasks = [task];
        let lineage = parsed(&by_lineage(&tasks, &[]))?;
        assert_eq!(lineage.pointer("/summary/0/name"), Some(&json!(awkward)));
        let func_name = parsed(&by_func_name(&tasks))?;
        assert_eq!(
            func_name
                .pointer("/summary")
                .and_then(Json::as_object)
                .map(|groups| groups.keys().cloned().collect::<Vec<_>>()),
            Some(vec![awkward.to_owned()])
        );
        Ok(())
    }
}
