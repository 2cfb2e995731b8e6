//! `hetmem demo`: a growable KV cache over virtual memory, the way LLM servers use it
//! (vAttention), driven by real or trace-shaped request sizes.
//!
//! The cache reserves each layer's K and V buffer for `batch slots x max context` tokens and maps
//! physical pages only as tokens arrive; see [`kvcache`] for the cache and [`server`] for the
//! serving loop. With `--trace`, request sizes come from the Azure LLM inference trace 2023
//! (CC-BY 4.0), Patel et al., "Splitwise", ISCA 2024, read from `../shared/data/`, never copied;
//! the whole trace unless `--requests` limits it. Progress goes to stderr ([`progress`]),
//! `--plot` draws the replay ([`plot`]) and `--json` writes every figure of the report.

mod free_policies;
mod ipc;
mod kvcache;
mod managed;
mod plot;
mod progress;
mod server;
mod workload;

use std::path::PathBuf;

use crate::args::{count, seconds};
use crate::info::human;
use kvcache::{KvCache, Layout};
use server::{serve, Job, Stats, StepView};
use workload::TRACE_ATTRIBUTION;

/// Arguments of `hetmem demo`. Defaults: Llama-3-8B's KV cache (32 layers, 8 KV heads, head
/// dimension 128, fp16), 16 batch slots of 8,192 tokens, 2 MiB pages, a synthetic stream shaped
/// like the Azure conversation trace.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Transformer layers; each has one K and one V buffer.
    #[arg(long, default_value_t = 32, allow_negative_numbers = true, value_parser = count::<u32>(1, 1024))]
    layers: u32,
    /// KV heads per layer.
    #[arg(long, default_value_t = 8, allow_negative_numbers = true, value_parser = count::<u32>(1, 1 << 16))]
    kv_heads: u32,
    /// Dimension of each head.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true, value_parser = count::<u32>(1, 1 << 16))]
    head_dim: u32,
    /// Bytes per element (2 for fp16 / bf16).
    #[arg(long, default_value_t = 2, allow_negative_numbers = true, value_parser = count::<u32>(1, 64))]
    bytes_per_element: u32,
    /// Requests served at once (each owns one slot of every buffer).
    #[arg(long, default_value_t = 16, allow_negative_numbers = true, value_parser = count::<u32>(1, 1 << 16))]
    batch_slots: u32,
    /// Maximum context per request, in tokens (at least 2: a prompt token and an output token);
    /// longer requests are clipped (and counted).
    #[arg(long, default_value_t = 8192, allow_negative_numbers = true, value_parser = count::<u32>(2, u32::MAX as u64))]
    max_context: u32,
    /// Number of requests: with --trace, the first ones of the trace (default: all of it);
    /// else the length of the synthetic stream (default: 64).
    #[arg(long, allow_negative_numbers = true, value_parser = count::<usize>(1, MAX_REQUESTS))]
    requests: Option<usize>,
    /// Page size: the unit mapped at a time, one physical object each. Must be an answer of
    /// the page-size query (64K or 2M on the host backend). Default: the query's answer for
    /// one buffer's size (2 MiB).
    #[arg(long)]
    page_size: Option<String>,
    /// Backend: host or cuda (default: $HETMEM_BACKEND, else host).
    #[arg(long)]
    backend: Option<String>,
    /// Devices to spread the layers over, pipeline-style (default: all of the driver's).
    #[arg(long, allow_negative_numbers = true, value_parser = count::<u32>(1, 1 << 16))]
    devices: Option<u32>,
    /// Seed of the synthetic request stream.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    seed: u64,
    /// Which scene to run (default: all of them, the KV cache first).
    #[arg(long, value_enum, default_value_t = Scene::All)]
    scene: Scene,
    /// Replay a CSV in the Azure LLM inference trace format
    /// (TIMESTAMP,ContextTokens,GeneratedTokens), e.g.
    /// ../shared/data/azure-llm-inference-2023/conv.csv.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// No progress on stderr (the report on stdout is the same).
    #[arg(long, short)]
    quiet: bool,
    /// Seconds between progress lines when stderr is not a terminal (0: a line whenever a
    /// request finishes). On a terminal the progress bar updates in place.
    #[arg(long, default_value_t = 5.0, allow_negative_numbers = true, value_parser = seconds(1e6))]
    progress_interval: f64,
    /// Draw the KV cache's memory over the replay and the map / unmap latency distribution into
    /// this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write every figure of the KV-cache report to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The most requests a run takes (the caps of the counts keep bookkeeping allocations sane on
/// absurd input).
const MAX_REQUESTS: u64 = 10_000_000;

pub(crate) use crate::args::thousands;

/// The `q` quantile (nearest rank) of `v`, in microseconds.
fn quantile_us(v: &mut [u64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i] as f64 / 1000.0
}

/// The scenes of `hetmem demo`. `all` (the default) runs each in turn, the KV cache first.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scene {
    /// Every scene, in turn.
    All,
    /// The growable KV cache (the main job).
    KvCache,
    /// The free policies of zeMemFreeExt on a queued 512 MiB copy (on the host backend a
    /// modelled 1 GiB device).
    FreePolicies,
    /// Weight sharing: a trainer process publishes its tensors with one IPC range handle; a
    /// server process opens it and checksums every tensor (vs one handle per tensor).
    Ipc,
    /// ACL managed memory processed in chunks with prefetch: migration counters and range
    /// attributes (on the host backend a working set 4x a modelled device, with eviction).
    Managed,
}

impl Scene {
    /// The scenes `all` runs, in order.
    const ALL: &'static [Scene] = &[
        Scene::KvCache,
        Scene::FreePolicies,
        Scene::Ipc,
        Scene::Managed,
    ];
}

pub fn run(args: Args) -> Result<(), String> {
    // The counts' ranges are checked as they are parsed (`crate::args`); the output files
    // here, before any scene runs, so that a long replay is not thrown away at its end.
    crate::args::check_outputs(&[
        ("--plot", args.plot.as_deref()),
        ("--json", args.json.as_deref()),
    ])?;
    let scenes = match args.scene {
        Scene::All => Scene::ALL.to_vec(),
        one => vec![one],
    };
    for (i, scene) in scenes.iter().enumerate() {
        if i > 0 {
            println!();
        }
        match scene {
            Scene::KvCache => run_kv_cache(&args)?,
            Scene::FreePolicies => free_policies::run(args.backend.as_deref())?,
            Scene::Ipc => ipc::run(args.backend.as_deref())?,
            Scene::Managed => managed::run(args.backend.as_deref())?,
            Scene::All => unreachable!("not a scene of its own"),
        }
    }
    Ok(())
}

/// The growable KV cache scene.
fn run_kv_cache(args: &Args) -> Result<(), String> {
    let tok_bytes = args.kv_heads as u64 * args.head_dim as u64 * args.bytes_per_element as u64;
    if tok_bytes < 8 {
        return Err(format!(
            "one token's K for one layer is {tok_bytes} bytes (kv heads x head dim x bytes per \
             element); it must hold the demo's 8-byte tag"
        ));
    }
    let tok_bytes = usize::try_from(tok_bytes).map_err(|_| "token size overflows".to_string())?;

    // The request stream, before any memory is touched, so bad input fails fast.
    let (reqs, source) = match &args.trace {
        Some(path) => {
            let r = workload::read_trace(path, args.requests.unwrap_or(usize::MAX))?;
            let s = format!(
                "{} requests of {} (in file order, the trace's arrival order)\n\
                 attribution:  {TRACE_ATTRIBUTION}",
                r.len(),
                path.display()
            );
            (r, s)
        }
        None => {
            let n = args.requests.unwrap_or(64);
            (
                workload::synthetic(n, args.seed),
                format!(
                    "{n} synthetic requests, seed {}, shaped like the Azure conversation trace \
                     (log-normal; median prompt 1,000 and output 130 tokens; at most 14,000 in \
                     all)",
                    args.seed
                ),
            )
        }
    };
    // Trace rows of 0 prompt or 0 output tokens: served as they are, counted and reported.
    let zero = workload::ZeroRows::of(&reqs);
    let max = args.max_context;
    let mut clipped = 0usize;
    let jobs: Vec<Job> = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let prompt = r.prompt.min(max - 1);
            let total = (prompt as u64 + r.output as u64).min(max as u64) as u32;
            if prompt as u64 + (r.output as u64) > max as u64 {
                clipped += 1;
            }
            Job {
                id: i as u64,
                prompt,
                total,
            }
        })
        .collect();

    let rt = crate::common::runtime_from_env(args.backend.as_deref())?;
    let drv = rt.driver();
    let ctx = drv.create_context().map_err(|e| e.to_string())?;
    let all = drv.devices();
    let ndev = args.devices.unwrap_or(all.len() as u32);
    if ndev == 0 || ndev as usize > all.len() || ndev > args.layers {
        return Err(format!(
            "--devices {ndev}: the driver has {} devices and the model {} layers; choose 1 to {}",
            all.len(),
            args.layers,
            (all.len() as u32).min(args.layers)
        ));
    }
    let devices: Vec<_> = all.into_iter().take(ndev as usize).collect();

    // The page size: what the page-size query answers, never a literal.
    let q = |size: usize| -> Result<usize, String> {
        devices
            .iter()
            .map(|d| ctx.query_page_size(d, size).map_err(|e| e.to_string()))
            .try_fold(0, |a, p| p.map(|p| a.max(p)))
    };
    let slot_bytes = args.max_context as usize * tok_bytes;
    let page = match &args.page_size {
        None => q((args.batch_slots as usize).saturating_mul(slot_bytes))?,
        Some(s) => {
            let p = hetmem::parse_bytes(s).map_err(|e| format!("--page-size: {e}"))?;
            let p = usize::try_from(p).map_err(|_| format!("--page-size {s} is too large"))?;
            let (small, large) = (q(1)?, q(usize::MAX / 2)?);
            if p == 0 || q(p)? != p {
                return Err(format!(
                    "--page-size {s} ({p} bytes) is not a page size the page-size query answers; \
                     choose {} or {}",
                    human(small as u64),
                    human(large as u64)
                ));
            }
            p
        }
    };

    let layout = Layout {
        layers: args.layers,
        tok_bytes,
        slots: args.batch_slots as usize,
        max_context: args.max_context,
        page,
    };
    let mut cache = KvCache::new(ctx.clone(), devices.clone(), layout)?;
    let nbufs = cache.buffers();
    let token_all = tok_bytes * nbufs;
    let capacity: u64 = devices.iter().map(|d| d.info().capacity).sum();

    println!("hetmem demo: a growable KV cache over virtual memory (vAttention-style)");
    println!("input:        {source}");
    if let Some(z) = zero.describe() {
        println!("trace rows:   {z}");
    }
    println!(
        "model:        {} layers x {} KV heads x head dim {} x {} B: {} per token per layer \
         for K and as much for V, {} per token",
        args.layers,
        args.kv_heads,
        args.head_dim,
        args.bytes_per_element,
        human(tok_bytes as u64),
        human(token_all as u64)
    );
    let split: Vec<String> = cache
        .device_layers()
        .iter()
        .map(|(d, a, b)| format!("layers {a}-{b} on device {d}"))
        .collect();
    println!(
        "backend:      {}, {} device(s) of {} ({} in all): {}",
        drv.backend_kind().name(),
        devices.len(),
        human(devices[0].info().capacity),
        human(capacity),
        split.join(", ")
    );
    println!(
        "cache:        {} buffers, each {} slots x {} tokens = {} reserved ({} in all); \
         page {} ({} tokens per page per buffer)",
        nbufs,
        args.batch_slots,
        thousands(args.max_context as u64),
        human(cache.buffer_bytes as u64),
        human(cache.buffer_bytes as u64 * nbufs as u64),
        human(page as u64),
        thousands((page / tok_bytes) as u64)
    );

    let mut progress = progress::Progress::new(
        args.quiet,
        std::time::Duration::from_secs_f64(args.progress_interval),
        jobs.len(),
        page,
    );
    let mut series = plot::Series::new(1500);
    let mut last = None;
    let result = serve(
        &mut cache,
        &jobs,
        args.batch_slots as usize,
        token_all,
        &mut |v: &StepView| {
            progress.step(v);
            series.record(v.step, v.mapped as u64, v.used as u64, v.busy_slots as u64);
            last = Some(*v);
        },
    );
    let created: usize = cache.created.iter().sum();
    let stats = match result {
        Ok(s) => s,
        Err(e) => {
            progress.abandon();
            drop(cache); // the context's teardown releases what is still mapped
            return Err(e);
        }
    };
    if let Some(v) = &last {
        progress.finish(v);
    }
    let mut map_ns = std::mem::take(&mut cache.map_ns);
    let mut unmap_ns = std::mem::take(&mut cache.unmap_ns);
    let (tag_write_ns, tag_check_ns) = (cache.tag_write_ns, cache.tag_check_ns.get());
    cache.destroy()?;
    let vs = drv.vm_stats();
    if vs.reservations != 0 || vs.physical_objects != 0 || vs.mapped_runs != 0 {
        return Err(format!(
            "after the run {} reservations, {} physical objects and {} mappings are left",
            vs.reservations, vs.physical_objects, vs.mapped_runs
        ));
    }

    let mut fig = report(
        args,
        &stats,
        clipped,
        created,
        page,
        token_all,
        &mut map_ns,
        &mut unmap_ns,
    );
    if let Some(path) = &args.plot {
        let title = match &args.trace {
            Some(t) => t
                .file_name()
                .map_or("trace".into(), |f| f.to_string_lossy().into_owned()),
            None => "synthetic stream".into(),
        };
        plot::draw(
            path,
            &plot::PlotInput {
                title: &title,
                series: &series,
                slot_bytes: args.max_context as u64 * token_all as u64,
                slots: args.batch_slots as u64,
                map_ns: &map_ns,
                unmap_ns: &unmap_ns,
                page: &human(page as u64),
            },
        )?;
        if !args.quiet {
            eprintln!("hetmem demo: plot written to {}", path.display());
        }
    }
    // Where the wall time went: the calls on the cache's path, the rest is the scheduler.
    let secs = |ns: u64| ns as f64 / 1e9;
    let (m, u) = (map_ns.iter().sum::<u64>(), unmap_ns.iter().sum::<u64>());
    println!(
        "time:         map {:.2} s, unmap {:.2} s, tag writes {:.2} s, tag checks {:.2} s \
         (of {:.2} s wall)",
        secs(m),
        secs(u),
        secs(tag_write_ns),
        secs(tag_check_ns),
        stats.wall.as_secs_f64()
    );
    if args.trace.is_some() {
        fig.insert("trace_rows_zero_prompt".into(), zero.prompt.len().into());
        fig.insert("trace_rows_zero_output".into(), zero.output.len().into());
    }
    fig.insert("map_total_s".into(), secs(m).into());
    fig.insert("unmap_total_s".into(), secs(u).into());
    fig.insert("tag_write_total_s".into(), secs(tag_write_ns).into());
    fig.insert("tag_check_total_s".into(), secs(tag_check_ns).into());
    fig.insert("tags_checked".into(), stats.tags_checked.into());
    fig.insert("verified".into(), stats.first_bad.is_none().into());
    fig.insert("failed_checks".into(), stats.failed_checks.into());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&serde_json::Value::Object(fig))
            .map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        if !args.quiet {
            eprintln!("hetmem demo: figures written to {}", path.display());
        }
    }
    match stats.first_bad {
        None => {
            println!(
                "verification: OK ({} tags checked)",
                thousands(stats.tags_checked)
            );
            Ok(())
        }
        Some(b) => {
            println!(
                "verification: FAILED at {:#x} (request {}, layer {}, token {}) in the {} cache; \
                 {} sequence(s) failed, {} tags checked OK",
                b.addr,
                b.request,
                b.layer,
                b.token,
                b.kv.name(),
                stats.failed_checks,
                thousands(stats.tags_checked)
            );
            Err("KV cache verification failed".into())
        }
    }
}

/// Prints the report and returns every figure of it, for `--json`.
#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    st: &Stats,
    clipped: usize,
    created: usize,
    page: usize,
    token_all: usize,
    map_ns: &mut [u64],
    unmap_ns: &mut [u64],
) -> serde_json::Map<String, serde_json::Value> {
    let mut j = serde_json::Map::new();
    let mut put = |k: &str, v: serde_json::Value| {
        j.insert(k.to_string(), v);
    };
    put("scene", "kv-cache".into());
    put(
        "input",
        match &args.trace {
            Some(t) => t.display().to_string().into(),
            None => format!("synthetic, seed {}", args.seed).into(),
        },
    );
    if args.trace.is_some() {
        put("attribution", TRACE_ATTRIBUTION.into());
    }
    put("layers", args.layers.into());
    put("batch_slots", args.batch_slots.into());
    put("max_context_tokens", args.max_context.into());
    put("token_bytes_all_layers", token_all.into());
    put("page_bytes", page.into());

    let peak_phys = created as u64 * page as u64;
    let prealloc = args.batch_slots as u64 * args.max_context as u64 * token_all as u64;
    println!(
        "requests:     {} served ({} clipped to {} tokens, {} preemptions)",
        st.served,
        clipped,
        thousands(args.max_context as u64),
        st.preemptions
    );
    put("requests_served", st.served.into());
    put("requests_clipped", clipped.into());
    put("preemptions", st.preemptions.into());
    println!(
        "tokens:       {} ({} prompt + {} generated; {} recomputed after preemption) in {} steps",
        thousands(st.prompt_tokens + st.generated_tokens),
        thousands(st.prompt_tokens),
        thousands(st.generated_tokens),
        thousands(st.recomputed_tokens),
        thousands(st.steps)
    );
    put("tokens", (st.prompt_tokens + st.generated_tokens).into());
    put("prompt_tokens", st.prompt_tokens.into());
    put("generated_tokens", st.generated_tokens.into());
    put("recomputed_tokens", st.recomputed_tokens.into());
    put("steps", st.steps.into());
    println!(
        "memory:       peak physical {} ({} objects of {}, reused from a pool; peak mapped {}) \
         vs {} to pre-allocate the maximum context per slot: {:.1}% of it ({:.1}x less)",
        human(peak_phys),
        thousands(created as u64),
        human(page as u64),
        human(st.peak_mapped as u64),
        human(prealloc),
        100.0 * peak_phys as f64 / prealloc as f64,
        prealloc as f64 / peak_phys.max(1) as f64
    );
    put("peak_physical_bytes", peak_phys.into());
    put("physical_objects_created", created.into());
    put("peak_mapped_bytes", st.peak_mapped.into());
    put("preallocate_max_context_bytes", prealloc.into());
    put(
        "peak_physical_pct_of_preallocation",
        (100.0 * peak_phys as f64 / prealloc as f64).into(),
    );
    let at_peak = if st.peak_mapped == 0 {
        0.0
    } else {
        100.0 * (st.peak_mapped - st.used_at_peak) as f64 / st.peak_mapped as f64
    };
    let avg = if st.sum_mapped == 0 {
        0.0
    } else {
        100.0 * st.sum_unused as f64 / st.sum_mapped as f64
    };
    println!(
        "fragmentation: {at_peak:.1}% of mapped bytes allocated but unused at peak mapped; \
         {avg:.1}% averaged over steps (internal, {} pages)",
        human(page as u64)
    );
    put("fragmentation_at_peak_pct", at_peak.into());
    put("fragmentation_avg_pct", avg.into());
    let (nm, nu) = (map_ns.len(), unmap_ns.len());
    let (m50, m99) = (quantile_us(map_ns, 0.5), quantile_us(map_ns, 0.99));
    let (u50, u99) = (quantile_us(unmap_ns, 0.5), quantile_us(unmap_ns, 0.99));
    println!(
        "map:          p50 {m50:.1} us, p99 {m99:.1} us ({} calls of one {} page)",
        thousands(nm as u64),
        human(page as u64)
    );
    println!(
        "unmap:        p50 {u50:.1} us, p99 {u99:.1} us ({} calls of one {} page)",
        thousands(nu as u64),
        human(page as u64)
    );
    put("map_calls", nm.into());
    put("map_p50_us", m50.into());
    put("map_p99_us", m99.into());
    put("unmap_calls", nu.into());
    put("unmap_p50_us", u50.into());
    put("unmap_p99_us", u99.into());
    put("capacity_refusals", st.refusals.into());
    if let Some(first) = &st.first_refusal {
        println!(
            "capacity:     {} page(s) refused (preempting or delaying requests); first: {first}",
            thousands(st.refusals)
        );
        put("first_refusal", first.clone().into());
    }
    let secs = st.wall.as_secs_f64().max(1e-9);
    let tps = (st.prompt_tokens + st.generated_tokens) as f64 / secs;
    println!(
        "throughput:   {} tokens/s, {:.1} requests/s ({:.2} s wall)",
        thousands(tps as u64),
        st.served as f64 / secs,
        secs
    );
    put("tokens_per_s", tps.into());
    put("requests_per_s", (st.served as f64 / secs).into());
    put("wall_s", secs.into());
    j
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits_by_three() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn quantile_is_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(quantile_us(&mut v, 0.5), 50.0);
        assert_eq!(quantile_us(&mut v, 0.99), 99.0);
        assert_eq!(quantile_us(&mut [], 0.5), 0.0);
    }
}
