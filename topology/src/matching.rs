//! Bipartite matching (Kuhn's augmenting paths): can every row get its own column?
//!
//! The mapping search uses it to prune (a partial mapping whose remaining GPUs cannot all
//! get distinct candidates cannot be completed), and the report uses the Hall violator it
//! finds to say which GPUs compete for too few local GPUs.

use crate::bitset::BitSet;

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Matching {
    /// Every row got a column: `columns[row]`.
    Complete(Vec<usize>),
    /// These rows can only use these (fewer) columns between them.
    Deficient {
        rows: Vec<usize>,
        columns: Vec<usize>,
    },
}

/// Matches each row to a distinct column among `rows[row]` (sets of columns below
/// `n_columns`).
pub(crate) fn match_rows(rows: &[BitSet], n_columns: usize) -> Matching {
    let mut row_of_column: Vec<Option<usize>> = vec![None; n_columns];
    for row in 0..rows.len() {
        let mut seen = BitSet::new(n_columns);
        if !augment(row, rows, &mut row_of_column, &mut seen) {
            // The rows reachable from `row` by alternating paths use only `seen` columns,
            // and there is one row more than columns: a Hall violator.
            let mut violators: Vec<usize> = seen.iter().filter_map(|c| row_of_column[c]).collect();
            violators.push(row);
            violators.sort_unstable();
            return Matching::Deficient {
                rows: violators,
                columns: seen.iter().collect(),
            };
        }
    }
    let mut columns = vec![0; rows.len()];
    for (column, row) in row_of_column.iter().enumerate() {
        if let Some(row) = row {
            columns[*row] = column;
        }
    }
    Matching::Complete(columns)
}

/// Whether every row can get a distinct column.
pub(crate) fn is_complete(rows: &[BitSet], n_columns: usize) -> bool {
    let mut row_of_column: Vec<Option<usize>> = vec![None; n_columns];
    (0..rows.len()).all(|row| {
        let mut seen = BitSet::new(n_columns);
        augment(row, rows, &mut row_of_column, &mut seen)
    })
}

fn augment(
    row: usize,
    rows: &[BitSet],
    row_of_column: &mut [Option<usize>],
    seen: &mut BitSet,
) -> bool {
    for column in rows[row].iter() {
        if seen.contains(column) {
            continue;
        }
        seen.insert(column);
        let free = match row_of_column[column] {
            None => true,
            Some(other) => augment(other, rows, row_of_column, seen),
        };
        if free {
            row_of_column[column] = Some(row);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(n: usize, members: &[usize]) -> BitSet {
        let mut s = BitSet::new(n);
        for &m in members {
            s.insert(m);
        }
        s
    }

    #[test]
    fn finds_a_complete_matching_through_augmenting_paths() {
        // Row 0 takes column 0 first; row 1 can only use 0, so row 0 moves to 1.
        let rows = [set(3, &[0, 1]), set(3, &[0]), set(3, &[1, 2])];
        let Matching::Complete(columns) = match_rows(&rows, 3) else {
            panic!("expected a matching");
        };
        assert_eq!(columns, vec![1, 0, 2]);
        assert!(is_complete(&rows, 3));
    }

    #[test]
    fn reports_a_hall_violator() {
        let rows = [
            set(4, &[0, 1]),
            set(4, &[2, 3]),
            set(4, &[0, 1]),
            set(4, &[1, 0]),
        ];
        assert_eq!(
            match_rows(&rows, 4),
            Matching::Deficient {
                rows: vec![0, 2, 3],
                columns: vec![0, 1]
            }
        );
        assert!(!is_complete(&rows, 4));
    }
}
