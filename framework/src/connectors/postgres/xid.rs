//! Global transaction ids for `PREPARE TRANSACTION`: one per job,
//! operator, subtask and checkpoint, so a restarted sink can find (and
//! commit or roll back) exactly the prepared transactions of its own
//! subtask and no one else's.
//!
//! This module owns the id's format and its parsing. It never talks to
//! the server.

use super::config::validate_name;
use super::error::PostgresError;

/// What every id of this sink starts with.
const PREFIX: &str = "snapflow";

/// The ids of one sink subtask: `snapflow:<job>:<operator>:<subtask>:<checkpoint>`.
///
/// Names are checked (`validate_name`) to hold no `:` and no quote, so
/// an id is safe inside a SQL string literal, and one subtask's prefix is
/// never the prefix of another's (the subtask number ends with `:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionIds {
    prefix: String,
}

impl TransactionIds {
    /// The ids of `subtask` of `operator` in `job`.
    ///
    /// # Errors
    ///
    /// [`PostgresError::InvalidName`] for a name `validate_name` refuses.
    pub fn new(job: &str, operator: &str, subtask: usize) -> Result<Self, PostgresError> {
        validate_name(job)?;
        validate_name(operator)?;
        Ok(TransactionIds {
            prefix: format!("{PREFIX}:{job}:{operator}:{subtask}:"),
        })
    }

    /// What every id of this subtask starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The id of checkpoint `checkpoint`'s transaction.
    pub fn id(&self, checkpoint: u64) -> String {
        format!("{}{checkpoint}", self.prefix)
    }

    /// The checkpoint of `gid` if it is one of this subtask's ids, written
    /// exactly as [`TransactionIds::id`] writes it.
    pub fn parse(&self, gid: &str) -> Option<u64> {
        let digits = gid.strip_prefix(self.prefix.as_str())?;
        if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        let checkpoint: u64 = digits.parse().ok()?;
        // `...:07` is no id this sink writes.
        (self.id(checkpoint) == gid).then_some(checkpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_other_subtasks_ids_are_not_ours() {
        let ids = TransactionIds::new("job", "sink", 1).expect("valid names");
        assert_eq!(ids.id(42), "snapflow:job:sink:1:42");
        assert_eq!(ids.parse("snapflow:job:sink:1:42"), Some(42));
        for other in [
            "snapflow:job:sink:11:42",
            "snapflow:job:sink:1:042",
            "snapflow:job:sink:1:",
            "snapflow:job:sink2:1:4",
            "snapflow:job:sink:1:4x",
        ] {
            assert_eq!(ids.parse(other), None, "{other}");
        }
    }
}
