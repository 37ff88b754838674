//! The summaries checked against Ray's: its test vector, grouping rules, dropped subtrees, depth
//! and JSON escaping.

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
fn on_actor(id: &str, name: &str, kind: &str, state: &str, actor: &str, ts: i64) -> SummaryTask {
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
    // The captured Ray test vector, in its order.
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
