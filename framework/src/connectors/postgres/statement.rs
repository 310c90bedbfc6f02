//! What the sink runs for its rows: the user's statement once per row, or
//! one multi-row `INSERT ... VALUES (...), (...)` per chunk of a batch.
//!
//! This module owns turning buffered rows into statements: building the
//! multi-row text, splitting a batch into chunks that stay under
//! PostgreSQL's limit on parameters, checking each row's width. It never
//! decides when rows are sent or in which transaction; the sink does.
//!
//! Why two forms: one statement per row costs a round trip per row (the
//! blocking client does not pipeline), which caps a sink at some tens of
//! thousands of rows per second on a local server; a multi-row statement
//! costs one round trip per chunk. The multi-row form is opt-in because it
//! changes what one statement does: an upsert whose chunk holds one key
//! twice fails (PostgreSQL: "ON CONFLICT DO UPDATE command cannot affect
//! row a second time"), where the per-row form applies both in order.

use std::fmt::Write;

use super::error::PostgresError;

/// PostgreSQL's limit on the parameters of one statement (the wire
/// protocol counts them in 16 bits).
pub const MAX_STATEMENT_PARAMS: usize = 65_535;

/// A multi-row insert: `INSERT INTO <into> VALUES ($1, ..), (..) <suffix>`,
/// one parenthesised group of `params_per_row` parameters per row.
///
/// ```
/// use snapflow::connectors::postgres::MultiRowInsert;
///
/// let upsert = MultiRowInsert::new("counts (word, count)", 2)
///     .on_conflict("(word) DO UPDATE SET count = GREATEST(counts.count, EXCLUDED.count)");
/// assert_eq!(
///     upsert.sql(2),
///     "INSERT INTO counts (word, count) VALUES ($1, $2), ($3, $4) ON CONFLICT (word) \
///      DO UPDATE SET count = GREATEST(counts.count, EXCLUDED.count)"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiRowInsert {
    into: String,
    params_per_row: usize,
    suffix: String,
}

impl MultiRowInsert {
    /// Rows of `params_per_row` parameters into `into`, the table and its
    /// column list as SQL (for example `counts (word, count)`). Like the
    /// per-row statement, this is the user's SQL, sent as given.
    pub fn new(into: &str, params_per_row: usize) -> MultiRowInsert {
        MultiRowInsert {
            into: into.to_string(),
            params_per_row,
            suffix: String::new(),
        }
    }

    /// Adds `ON CONFLICT <clause>` after the values, for an upsert. A
    /// chunk must then not hold two rows with the same conflict key (see
    /// the module documentation of `snapflow::connectors::postgres`).
    pub fn on_conflict(mut self, clause: &str) -> MultiRowInsert {
        self.suffix = format!(" ON CONFLICT {clause}");
        self
    }

    /// The parameters each row gives.
    pub fn params_per_row(&self) -> usize {
        self.params_per_row
    }

    /// The most rows one statement can take: PostgreSQL's limit of
    /// [`MAX_STATEMENT_PARAMS`] parameters over the row width.
    pub fn rows_per_statement_max(&self) -> usize {
        MAX_STATEMENT_PARAMS / self.params_per_row.max(1)
    }

    /// The statement text for `rows` rows.
    pub fn sql(&self, rows: usize) -> String {
        let mut sql = format!("INSERT INTO {} VALUES ", self.into);
        let mut param = 0;
        for row in 0..rows {
            sql.push_str(if row == 0 { "(" } else { ", (" });
            for column in 0..self.params_per_row {
                param += 1;
                let separator = if column == 0 { "" } else { ", " };
                // Writing into a String cannot fail.
                let _ = write!(sql, "{separator}${param}");
            }
            sql.push(')');
        }
        sql.push_str(&self.suffix);
        sql
    }

    /// Checks the shape before anything connects.
    ///
    /// # Errors
    ///
    /// [`PostgresError::InvalidName`] for zero parameters per row or more
    /// than [`MAX_STATEMENT_PARAMS`].
    pub(crate) fn validate(&self) -> Result<(), PostgresError> {
        if self.params_per_row == 0 || self.params_per_row > MAX_STATEMENT_PARAMS {
            return Err(PostgresError::InvalidName {
                name: format!("params_per_row = {}", self.params_per_row),
                reason: "a row must have between 1 and 65535 parameters",
            });
        }
        Ok(())
    }

    /// Checks that a row has the width the statement expects.
    ///
    /// # Errors
    ///
    /// [`PostgresError::RowWidth`] (not retryable: the user's function
    /// gives the same row again).
    pub(crate) fn check_row(&self, found: usize) -> Result<(), PostgresError> {
        if found == self.params_per_row {
            return Ok(());
        }
        Err(PostgresError::RowWidth {
            expected: self.params_per_row,
            found,
        })
    }
}

/// The statement form a sink runs.
#[derive(Debug, Clone)]
pub(crate) enum RowStatement {
    /// The user's statement, once per row.
    PerRow(String),
    /// One multi-row insert per chunk.
    MultiRow(MultiRowInsert),
}

impl RowStatement {
    /// The text to prepare at the factory's start check: the per-row
    /// statement, or the multi-row one for a single row.
    pub(crate) fn check_sql(&self) -> String {
        match self {
            RowStatement::PerRow(sql) => sql.clone(),
            RowStatement::MultiRow(insert) => insert.sql(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_multi_row_text_numbers_parameters_row_by_row() {
        let insert = MultiRowInsert::new("t (a, b, c)", 3);
        assert_eq!(insert.sql(1), "INSERT INTO t (a, b, c) VALUES ($1, $2, $3)");
        assert_eq!(
            insert.sql(2),
            "INSERT INTO t (a, b, c) VALUES ($1, $2, $3), ($4, $5, $6)"
        );
        assert_eq!(insert.rows_per_statement_max(), 21_845);
    }

    #[test]
    fn a_bad_width_is_refused() {
        assert!(MultiRowInsert::new("t (a)", 0).validate().is_err());
        assert!(MultiRowInsert::new("t (a)", 65_536).validate().is_err());
        let insert = MultiRowInsert::new("t (a, b)", 2);
        assert!(insert.validate().is_ok());
        assert!(insert.check_row(2).is_ok());
        let error = insert.check_row(1).expect_err("one parameter short");
        assert!(!error.is_retryable());
        assert!(error.to_string().contains("2"), "{error}");
    }
}
