//! Latency histograms (microseconds, HdrHistogram) and Jain's fairness index.

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::{names, record::Record};

/// A histogram of 1 µs to 120 s at 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

/// `d` in whole microseconds, at least 1.
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Writes the percentiles, largest and mean of `h` into `record` (nothing when it is empty).
pub fn latency(record: &mut Record, h: &Histogram<u64>) {
    if h.is_empty() {
        return;
    }
    record.set(names::P50, h.value_at_quantile(0.5) as f64);
    record.set(names::P90, h.value_at_quantile(0.9) as f64);
    record.set(names::P99, h.value_at_quantile(0.99) as f64);
    record.set(names::P999, h.value_at_quantile(0.999) as f64);
    record.set(names::MAX, h.max() as f64);
    record.set(names::MEAN, h.mean());
}

/// Jain's fairness index of `grants` per client: (Σx)² / (n·Σx²); 1 when all are equal.
pub fn jain(grants: &[u64]) -> f64 {
    let sum: f64 = grants.iter().map(|&x| x as f64).sum();
    let squares: f64 = grants.iter().map(|&x| (x as f64).powi(2)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (grants.len() as f64 * squares)
}

/// The median of `values` (NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jain's index is 1 for equal shares and 1/n when one client gets everything.
    #[test]
    fn jain_bounds() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-12);
        assert!((jain(&[8, 0, 0, 0]) - 0.25).abs() < 1e-12);
        assert_eq!(jain(&[0, 0]), 0.0);
    }

    /// Medians of odd and even counts.
    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
