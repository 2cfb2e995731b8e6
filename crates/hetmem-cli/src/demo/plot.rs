//! `hetmem demo --plot FILE.svg`: what the replay did to memory, and what map and unmap cost.
//!
//! Panel 1, over the decode steps: the physical memory hetmem mapped; what pre-allocating the
//! maximum context would take (for the busy slots, and for every slot, the static allocator's
//! figure); and the bytes the live tokens need. Panel 2: the distribution (CDF) of the latency of
//! every map and unmap call. SVG only: plotters' SVG backend writes text as SVG text, so no
//! fonts or system libraries are needed.

use std::path::Path;

use plotters::prelude::*;

/// One point of panel 1: the largest values over a bucket of steps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// First step of the bucket.
    pub step: u64,
    pub mapped: u64,
    pub used: u64,
    pub busy_slots: u64,
}

/// The memory series of a replay, in at most `2 * max_points` buckets: when full, neighbouring
/// buckets merge (keeping each quantity's maximum) and the bucket doubles, so a replay of any
/// length costs bounded memory and gives a plot of bounded size.
#[derive(Debug)]
pub struct Series {
    max_points: usize,
    /// Steps per bucket.
    bucket: u64,
    pub samples: Vec<Sample>,
}

impl Series {
    pub fn new(max_points: usize) -> Series {
        Series {
            max_points: max_points.max(1),
            bucket: 1,
            samples: Vec::new(),
        }
    }

    /// Records step `step` (steps come in increasing order).
    pub fn record(&mut self, step: u64, mapped: u64, used: u64, busy_slots: u64) {
        let start = step / self.bucket * self.bucket;
        match self.samples.last_mut() {
            Some(s) if s.step == start => {
                s.mapped = s.mapped.max(mapped);
                s.used = s.used.max(used);
                s.busy_slots = s.busy_slots.max(busy_slots);
            }
            _ => self.samples.push(Sample {
                step: start,
                mapped,
                used,
                busy_slots,
            }),
        }
        if self.samples.len() >= 2 * self.max_points {
            self.bucket *= 2;
            let b = self.bucket;
            let mut merged: Vec<Sample> = Vec::with_capacity(self.max_points + 1);
            for s in self.samples.drain(..) {
                let start = s.step / b * b;
                match merged.last_mut() {
                    Some(m) if m.step == start => {
                        m.mapped = m.mapped.max(s.mapped);
                        m.used = m.used.max(s.used);
                        m.busy_slots = m.busy_slots.max(s.busy_slots);
                    }
                    _ => merged.push(Sample { step: start, ..s }),
                }
            }
            self.samples = merged;
        }
    }

    /// Steps per point.
    pub fn bucket(&self) -> u64 {
        self.bucket
    }
}

/// What the plot shows besides the series.
pub struct PlotInput<'a> {
    pub title: &'a str,
    pub series: &'a Series,
    /// Bytes one slot needs for the maximum context (all buffers).
    pub slot_bytes: u64,
    /// Number of slots (the static pre-allocation is `slots * slot_bytes`).
    pub slots: u64,
    /// Latencies of every map and unmap call, in nanoseconds, sorted.
    pub map_ns: &'a [u64],
    pub unmap_ns: &'a [u64],
    pub page: &'a str,
}

/// At most `n` points of the CDF of sorted `v` (nanoseconds), as (microseconds, fraction).
fn cdf(v: &[u64], n: usize) -> Vec<(f64, f64)> {
    if v.is_empty() {
        return Vec::new();
    }
    let step = (v.len() / n.max(1)).max(1);
    let mut out: Vec<(f64, f64)> = (0..v.len())
        .step_by(step)
        .map(|i| (v[i].max(1) as f64 / 1000.0, (i + 1) as f64 / v.len() as f64))
        .collect();
    out.push((*v.last().expect("non-empty") as f64 / 1000.0, 1.0));
    out
}

/// A line of panel 1: legend, colour, points.
type Line = (String, RGBColor, Vec<(f64, f64)>);

const GIB: f64 = (1u64 << 30) as f64;

/// Draws the two panels into `path` (SVG).
pub fn draw(path: &Path, p: &PlotInput) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plotting to {}: {e}", path.display());
    let root = SVGBackend::new(path, (1100, 860)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(470);

    // Panel 1: memory over the replay.
    let s = &p.series.samples;
    let last_step = s.last().map_or(1, |x| x.step + p.series.bucket()).max(1) as f64;
    let all_slots = (p.slots * p.slot_bytes) as f64 / GIB;
    let ymax = s
        .iter()
        .map(|x| x.mapped as f64 / GIB)
        .fold(all_slots, f64::max)
        * 1.45; // room for the legend above the lines
    let mut c = ChartBuilder::on(&top)
        .caption(
            format!("{}: KV-cache memory over the replay", p.title),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..last_step, 0f64..ymax.max(1e-3))
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc(format!(
            "decode step (each point: the maximum over {} step(s))",
            p.series.bucket()
        ))
        .y_desc("GiB")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    let line = |f: &dyn Fn(&Sample) -> f64| -> Vec<(f64, f64)> {
        s.iter().map(|x| (x.step as f64, f(x))).collect()
    };
    let slot_bytes = p.slot_bytes;
    let series: [Line; 4] = [
        (
            format!("max context pre-allocated for every slot ({})", p.slots),
            RGBColor(150, 150, 150),
            vec![(0.0, all_slots), (last_step, all_slots)],
        ),
        (
            "max context pre-allocated for each busy slot".into(),
            RGBColor(230, 140, 20),
            line(&|x| (x.busy_slots * slot_bytes) as f64 / GIB),
        ),
        (
            format!("physical memory mapped by hetmem ({} pages)", p.page),
            RGBColor(200, 30, 30),
            line(&|x| x.mapped as f64 / GIB),
        ),
        (
            "bytes the live tokens need".into(),
            RGBColor(30, 90, 200),
            line(&|x| x.used as f64 / GIB),
        ),
    ];
    for (label, color, pts) in series {
        c.draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3))
            });
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;

    // Panel 2: latency CDFs, log scale.
    let lo = p
        .map_ns
        .first()
        .into_iter()
        .chain(p.unmap_ns.first())
        .map(|&v| v.max(1) as f64 / 1000.0)
        .fold(f64::INFINITY, f64::min);
    let hi = p
        .map_ns
        .last()
        .into_iter()
        .chain(p.unmap_ns.last())
        .map(|&v| v as f64 / 1000.0)
        .fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo * 0.8, hi * 1.25)
    } else {
        (0.1, 10.0)
    };
    let mut c = ChartBuilder::on(&bottom)
        .caption(
            format!(
                "map / unmap latency: {} map and {} unmap calls of one {} page",
                super::thousands(p.map_ns.len() as u64),
                super::thousands(p.unmap_ns.len() as u64),
                p.page
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0)
        .map_err(|e| err(&e))?;
    c.configure_mesh()
        .x_desc("latency per call, microseconds (log scale)")
        .y_desc("fraction of calls at most this")
        .x_label_formatter(&|v| format!("{v}"))
        .draw()
        .map_err(|e| err(&e))?;
    for (label, color, v) in [
        ("map", RGBColor(200, 30, 30), p.map_ns),
        ("unmap", RGBColor(30, 90, 200), p.unmap_ns),
    ] {
        c.draw_series(LineSeries::new(cdf(v, 600), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3))
            });
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_stays_bounded_and_keeps_every_maximum() {
        let mut s = Series::new(8);
        for step in 1..=1000u64 {
            // A spike at step 777 must survive the merging.
            let mapped = if step == 777 { 1_000_000 } else { step };
            s.record(step, mapped, step / 2, step % 16);
        }
        assert!(s.samples.len() < 16, "{} points", s.samples.len());
        assert!(s.bucket() >= 64);
        assert_eq!(s.samples.iter().map(|x| x.mapped).max(), Some(1_000_000));
        assert_eq!(s.samples.iter().map(|x| x.used).max(), Some(500));
        assert_eq!(s.samples.iter().map(|x| x.busy_slots).max(), Some(15));
        assert!(s.samples.windows(2).all(|w| w[0].step < w[1].step));
    }

    #[test]
    fn cdf_ends_at_the_largest_value_and_one() {
        let v: Vec<u64> = (1..=10_000).map(|x| x * 1000).collect();
        let c = cdf(&v, 100);
        assert!(c.len() <= 102);
        assert_eq!(*c.last().unwrap(), (10_000.0, 1.0));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert!(cdf(&[], 10).is_empty());
    }
}
