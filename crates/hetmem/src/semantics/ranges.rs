//! Range bookkeeping: an ordered map of disjoint half-open address ranges.
//!
//! [`RangeMap`] keeps non-overlapping `[start, end)` ranges, each with a value that knows how to
//! split itself ([`Splittable`]) and to merge with an adjacent neighbour. It is the one structure
//! behind mappings and access attributes; lookups are `O(log n)`.

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Included, Unbounded};

/// A value attached to a range, which can be cut at an offset and joined with its right
/// neighbour.
pub trait Splittable: Clone {
    /// The value for the part starting `delta` bytes into the range.
    fn shifted(&self, delta: usize) -> Self;
    /// Whether `self` (covering `len` bytes) followed directly by `next` can be one range.
    fn joins(&self, len: usize, next: &Self) -> bool;
}

/// One stored range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<V> {
    /// One past the last byte.
    pub end: usize,
    /// The value.
    pub value: V,
}

/// Disjoint ranges keyed by start address.
#[derive(Debug, Clone)]
pub struct RangeMap<V> {
    map: BTreeMap<usize, Entry<V>>,
}

impl<V> Default for RangeMap<V> {
    fn default() -> Self {
        RangeMap {
            map: BTreeMap::new(),
        }
    }
}

impl<V: Splittable> RangeMap<V> {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of stored ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no range is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The range that starts exactly at `start` (an exact lookup, cheaper than [`RangeMap::get`]).
    pub fn get_exact(&self, start: usize) -> Option<&Entry<V>> {
        self.map.get(&start)
    }

    /// Removes the range that starts exactly at `start`.
    pub fn remove_exact(&mut self, start: usize) -> Option<Entry<V>> {
        self.map.remove(&start)
    }

    /// The range containing `addr`, as `(start, entry)`.
    pub fn get(&self, addr: usize) -> Option<(usize, &Entry<V>)> {
        let (&s, e) = self.map.range(..=addr).next_back()?;
        (addr < e.end).then_some((s, e))
    }

    /// Ranges that overlap `[start, end)`, in address order, unclipped.
    pub fn overlapping(
        &self,
        start: usize,
        end: usize,
    ) -> impl Iterator<Item = (usize, &Entry<V>)> {
        let first = match self.map.range(..=start).next_back() {
            Some((&s, e)) if e.end > start => s,
            _ => start,
        };
        self.map
            .range((Included(first), Excluded(end)))
            .map(|(&s, e)| (s, e))
            .filter(move |(_, e)| e.end > start)
    }

    /// Whether any stored range overlaps `[start, end)` (one tree search).
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        self.last_overlap(start, end).is_some()
    }

    /// The last stored range that overlaps `[start, end)`, as `(start, entry)`: the last range
    /// starting before `end`, if it ends after `start` (one tree search).
    pub fn last_overlap(&self, start: usize, end: usize) -> Option<(usize, &Entry<V>)> {
        let (&s, e) = self.map.range(..end).next_back()?;
        (e.end > start).then_some((s, e))
    }

    /// Merges the range starting at `key` with its left and right neighbours where they join
    /// (one exact lookup and one tree search each side).
    pub fn join_neighbours(&mut self, key: usize) {
        let Some(e) = self.map.get(&key) else { return };
        let end = e.end;
        if let Some(r) = self.map.get(&end) {
            if e.value.joins(end - key, &r.value) {
                let r = self.map.remove(&end).expect("present");
                self.map.get_mut(&key).expect("present").end = r.end;
            }
        }
        if let Some((&l, le)) = self.map.range(..key).next_back() {
            if le.end == key && le.value.joins(key - l, &self.map[&key].value) {
                let e = self.map.remove(&key).expect("present");
                self.map.get_mut(&l).expect("present").end = e.end;
            }
        }
    }

    /// The first address in `[start, end)` not covered by a range, if any.
    pub fn first_gap(&self, start: usize, end: usize) -> Option<usize> {
        let mut at = start;
        for (s, e) in self.overlapping(start, end) {
            if s > at {
                return Some(at);
            }
            at = e.end;
            if at >= end {
                return None;
            }
        }
        (at < end).then_some(at)
    }

    /// Cuts the range containing `addr` (if it starts before `addr`) into two at `addr`.
    pub fn split_at(&mut self, addr: usize) {
        let Some((s, e)) = self.get(addr) else { return };
        if s == addr {
            return;
        }
        let end = e.end;
        let right = e.value.shifted(addr - s);
        self.map.get_mut(&s).expect("present").end = addr;
        self.map.insert(addr, Entry { end, value: right });
    }

    /// Inserts `[start, end)`; the caller has checked that it overlaps nothing.
    pub fn insert(&mut self, start: usize, end: usize, value: V) {
        debug_assert!(start < end && !self.overlaps(start, end));
        self.map.insert(start, Entry { end, value });
    }

    /// Removes every part of a range inside `[start, end)` (splitting ranges that cross the
    /// boundaries) and returns the removed pieces in address order.
    pub fn remove(&mut self, start: usize, end: usize) -> Vec<(usize, Entry<V>)> {
        self.split_at(start);
        self.split_at(end);
        let keys: Vec<usize> = self.map.range(start..end).map(|(&s, _)| s).collect();
        keys.into_iter()
            .map(|k| (k, self.map.remove(&k).expect("present")))
            .collect()
    }

    /// Applies `f` to every stored byte range inside `[start, end)` after splitting at the
    /// boundaries, then merges neighbours that join.
    pub fn update(&mut self, start: usize, end: usize, mut f: impl FnMut(&mut V)) {
        // Fast path: exactly one whole range.
        if let Some(e) = self.map.get_mut(&start) {
            if e.end == end {
                f(&mut e.value);
                self.join_neighbours(start);
                return;
            }
        }
        self.split_at(start);
        self.split_at(end);
        for (_, e) in self.map.range_mut(start..end) {
            f(&mut e.value);
        }
        self.coalesce(start, end);
    }

    /// Merges neighbouring ranges that join, from the range before `start` to the range that
    /// starts at or after `end`. Walks in place (no allocation): two tree lookups per range.
    pub fn coalesce(&mut self, start: usize, end: usize) {
        let first = self
            .map
            .range(..start)
            .next_back()
            .or_else(|| self.map.range(start..).next())
            .map(|(&s, _)| s);
        let Some(mut cur) = first else { return };
        loop {
            let (next, joins) = {
                let ce = &self.map[&cur];
                match self.map.range((Excluded(cur), Unbounded)).next() {
                    None => return,
                    Some((&k, ke)) => (k, ce.end == k && ce.value.joins(ce.end - cur, &ke.value)),
                }
            };
            if joins {
                let ke = self.map.remove(&next).expect("present");
                self.map.get_mut(&cur).expect("present").end = ke.end;
            } else if next >= end {
                return;
            } else {
                cur = next;
            }
        }
    }

    /// All ranges in address order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Entry<V>)> {
        self.map.iter().map(|(&s, e)| (s, e))
    }

    /// Ranges starting at or after `start`.
    pub fn from(&self, start: usize) -> impl Iterator<Item = (usize, &Entry<V>)> {
        self.map
            .range((Included(start), Unbounded))
            .map(|(&s, e)| (s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value that is an offset into some backing store, to check splitting and joining.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Off(usize);
    impl Splittable for Off {
        fn shifted(&self, d: usize) -> Self {
            Off(self.0 + d)
        }
        fn joins(&self, len: usize, next: &Self) -> bool {
            self.0 + len == next.0
        }
    }

    #[test]
    fn split_remove_and_coalesce_keep_offsets() {
        let mut m = RangeMap::new();
        m.insert(100, 200, Off(0));
        m.insert(300, 400, Off(1000));
        assert_eq!(m.first_gap(100, 400), Some(200));
        assert_eq!(m.first_gap(100, 200), None);
        let removed = m.remove(150, 350);
        assert_eq!(removed.len(), 2);
        assert_eq!(
            removed[0],
            (
                150,
                Entry {
                    end: 200,
                    value: Off(50)
                }
            )
        );
        assert_eq!(
            removed[1],
            (
                300,
                Entry {
                    end: 350,
                    value: Off(1000)
                }
            )
        );
        assert_eq!(m.get(120).unwrap().1.end, 150);
        assert_eq!(
            m.get(360).unwrap(),
            (
                350,
                &Entry {
                    end: 400,
                    value: Off(1050)
                }
            )
        );
        m.insert(150, 200, Off(50));
        m.coalesce(150, 200);
        assert_eq!(
            m.get(199).unwrap(),
            (
                100,
                &Entry {
                    end: 200,
                    value: Off(0)
                }
            )
        );
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn overlapping_finds_range_that_starts_before() {
        let mut m = RangeMap::new();
        m.insert(0, 100, Off(0));
        assert!(m.overlaps(50, 60));
        assert!(!m.overlaps(100, 200));
        assert_eq!(m.overlapping(99, 150).count(), 1);
    }
}
