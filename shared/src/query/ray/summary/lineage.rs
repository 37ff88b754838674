//! `summary_by=lineage`: Ray's task tree, built, grouped, totalled, sorted and written without
//! recursion (see the module's "Depth").

use std::cmp::Reverse;
use std::collections::HashMap;

use super::text::{StateCounts, Text, Totals};
use super::{SummaryActor, SummaryTask, display_name};

/// `summary_by=lineage`: the same object, as JSON text, with `summary` a list of nested nodes
/// (`{name, key, type, timestamp, state_counts, children, link}`) and `summary_by: "lineage"`.
///
/// `tasks` are detail rows in the order Ray's `list_tasks` returns them (by task id); `actors`
/// name the actor nodes. Tasks hang under the task that submitted them, actor tasks and the
/// actor's creation task under an `ACTOR` node, and that node under the creation task's
/// parent. A task whose parent (or actor's creation task) is missing is counted in the totals
/// but left out of the tree with everything under it. Same-named siblings are gathered into a
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
    lineage.group_siblings_everywhere();
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

/// Below this many siblings, grouping finds a name's group by scanning rather than hashing.
const SCAN_LIMIT: usize = 16;

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

    /// Step 3 (`merge_sibings_for_task_group`), bottom-up: each node's children are grouped
    /// after their own children were, and a node takes its subtree's earliest timestamp when
    /// that is earlier than its own; then the roots are grouped.
    fn group_siblings_everywhere(&mut self) {
        self.bottom_up(|lineage, index, children| {
            let earliest = lineage.group_siblings(children);
            if let Some(node) = index.and_then(|index| lineage.nodes.get_mut(index))
                && let Some(earliest) = truthy(earliest)
                && earliest < or_max(node.timestamp)
            {
                node.timestamp = Some(earliest);
            }
        });
    }

    /// Gathers siblings that share a name into a `GROUP` node (kept where the first of them
    /// was); a name held by one sibling keeps the sibling itself. Returns the earliest truthy
    /// timestamp among the siblings, as Ray computes it.
    fn group_siblings(&mut self, siblings: &mut Vec<usize>) -> Option<i64> {
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
            return earliest; // every name is unique: nothing to group
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
    /// children's counts (in grouped order) after its own, then sorts its children; then the
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
