//! Jobs, actors, nodes and workers merged from the captured events, compared with Ray's own
//! `ray list actors/jobs/nodes/workers` output for the same runs, in any order.

use afterglow_tests::ray_entities::{NOT_EXPORTED, compare};
use afterglow_tests::{FixtureRun, raw_events, shuffled};
use anyhow::ensure;
use shared::event::RayEvent;
use shared::merge::entities::SessionEntities;

/// The entities `events` (JSON texts) describe, each event applied in the order given.
fn collect(events: &[String]) -> anyhow::Result<SessionEntities> {
    let mut entities = SessionEntities::default();
    for text in events {
        let event = RayEvent::from_json(text)?;
        let at = event.timestamp.map_or(0, |timestamp| timestamp.nanos());
        entities.apply(at, &event.payload);
    }
    Ok(entities)
}

fn events_of(run: &FixtureRun) -> anyhow::Result<Vec<String>> {
    let mut events = Vec::new();
    for request in run.requests()? {
        events.extend(raw_events(&request.body)?);
    }
    Ok(events)
}

#[test]
fn entities_agree_with_rays_lists_in_any_order() -> anyhow::Result<()> {
    println!("not reproducible from the export: {NOT_EXPORTED:#?}");
    let mut compared = 0;
    for run in FixtureRun::all()? {
        let events = events_of(&run)?;
        let in_order = collect(&events)?;
        let (count, problems) = compare(&run, &in_order)?;
        ensure!(
            problems.is_empty(),
            "{}:\n{}",
            run.name,
            problems.join("\n")
        );
        compared += count;
        let mut scrambled = shuffled(&events, 9);
        scrambled.extend(shuffled(&events, 4));
        ensure!(
            collect(&scrambled)? == in_order,
            "{}: order or duplicates changed a record",
            run.name
        );
    }
    ensure!(compared > 50, "only {compared} entities compared");
    Ok(())
}
