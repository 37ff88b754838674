//! The ids a task id embeds: Ray builds a task id from its job id (the last 4 bytes) and, for
//! an actor's tasks, its actor id (the last 16), so both can be recovered from it alone.

use crate::event::encoding::Id;

/// The job id of a task id: its last 4 bytes.
pub fn job_id_of_task(task_id: &Id) -> Option<Id> {
    Id::from_hex(job_hex_of_task(task_id)?)
}

/// The hex of [`job_id_of_task`], borrowed from the task id.
pub fn job_hex_of_task(task_id: &Id) -> Option<&str> {
    let hex = task_id.as_hex();
    let start = hex.len().checked_sub(8)?;
    hex.get(start..)
}

/// The actor id of an actor (creation) task id: its last 16 bytes.
pub fn actor_id_of_task(task_id: &Id) -> Option<Id> {
    let hex = task_id.as_hex();
    let start = hex.len().checked_sub(32)?;
    Id::from_hex(hex.get(start..)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_embed_their_job_and_actor() {
        let task = Id::from_hex("ffffffffffffffffa29e28dedd372d0df3041dff02000000");
        let task = task.unwrap_or_else(|| panic!("valid hex"));
        assert_eq!(
            job_id_of_task(&task).map(|id| id.to_string()).as_deref(),
            Some("02000000")
        );
        assert_eq!(
            actor_id_of_task(&task).map(|id| id.to_string()).as_deref(),
            Some("a29e28dedd372d0df3041dff02000000")
        );
    }
}
