//! The serving loop: continuous batching over a fixed number of slots, in decode steps.
//!
//! Each step admits waiting requests (in arrival order) into free slots, their prompt mapped and
//! tagged at once; then every running request generates one token; then finished requests are
//! verified and release their pages. When a device has no room for a new page, the most recently
//! admitted other request is preempted (verified, unmapped, requeued at the front; it recomputes
//! its tokens on readmission, as vLLM's recompute preemption does). Admission never preempts: a
//! prompt that does not fit waits for running requests to finish. A request that does not fit
//! with nothing else running is an error, never a hang.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::kvcache::{is_capacity, BadTag, KvCache, Seq};

/// A request as served: clipped to the maximum context.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    pub id: u64,
    pub prompt: u32,
    /// Prompt plus output tokens.
    pub total: u32,
}

/// What the run measured.
#[derive(Debug, Default)]
pub struct Stats {
    pub served: usize,
    pub preemptions: usize,
    pub prompt_tokens: u64,
    pub generated_tokens: u64,
    /// Tokens tagged again after a preemption (recomputed on readmission).
    pub recomputed_tokens: u64,
    pub steps: u64,
    pub peak_mapped: usize,
    /// Token bytes in use at the step of peak mapped bytes.
    pub used_at_peak: usize,
    /// Sums over steps of mapped bytes and of mapped-but-unused bytes.
    pub sum_mapped: u128,
    pub sum_unused: u128,
    pub tags_checked: u64,
    /// Sequences whose verification failed.
    pub failed_checks: u64,
    pub first_bad: Option<BadTag>,
    pub wall: Duration,
    /// Times a device or OS limit refused a page, and the first refusal.
    pub refusals: u64,
    pub first_refusal: Option<String>,
}

impl Stats {
    fn note_refusal(&mut self, e: &hetmem::Error) {
        self.refusals += 1;
        self.first_refusal.get_or_insert_with(|| e.to_string());
    }
}

/// What the serving loop shows its observer at the end of every step.
#[derive(Debug, Clone, Copy)]
pub struct StepView {
    pub step: u64,
    pub served: usize,
    /// Prompt plus generated tokens of the requests served so far.
    pub tokens_served: u64,
    /// Bytes mapped now.
    pub mapped: usize,
    /// Bytes the live tokens need now (tokens of running requests x bytes per token).
    pub used: usize,
    /// Slots holding a request now.
    pub busy_slots: usize,
    /// Physical objects created so far (all live: unmapped ones wait in the pools).
    pub objects: usize,
}

struct Waiting {
    job: Job,
    /// Tokens it had when preempted (0 if never run).
    done: u32,
}

struct Running {
    job: Job,
    seq: Seq,
}

/// Serves `jobs` through `cache` with `slots` slots, showing `observe` the state at the end of
/// every step (progress, plots). Errors: a request too big to fit alone, or an unexpected hetmem
/// error.
pub fn serve(
    cache: &mut KvCache,
    jobs: &[Job],
    slots: usize,
    token_bytes_all: usize,
    observe: &mut dyn FnMut(&StepView),
) -> Result<Stats, String> {
    let start = Instant::now();
    let mut st = Stats::default();
    let mut queue: VecDeque<Waiting> = jobs.iter().map(|&job| Waiting { job, done: 0 }).collect();
    // Running requests in admission order: the last is the most recently admitted.
    let mut running: Vec<Running> = Vec::new();
    let mut free_slots: Vec<usize> = (0..slots).rev().collect();
    // Set when admission was refused memory; cleared when a request releases its pages.
    let mut admission_blocked = false;

    let too_big = |cache: &KvCache, job: &Job, e: &hetmem::Error| {
        let pages = cache.pages_for(job.total);
        format!(
            "request {} ({} prompt + {} output tokens) does not fit even alone: it needs {} \
             pages of {} bytes per buffer, {} bytes of KV cache in all ({} bytes per token), \
             and the devices refused: {e}",
            job.id,
            job.prompt,
            job.total - job.prompt,
            pages,
            cache.page(),
            pages as u128 * cache.page() as u128 * cache.buffers() as u128,
            token_bytes_all
        )
    };

    while !queue.is_empty() || !running.is_empty() {
        st.steps += 1;
        let mut progress = false;

        // Admit waiting requests into free slots; the prompt (or, after a preemption, every
        // token it had) arrives at once. A prompt that would not fit waits (unless nothing runs:
        // then trying it gives the error), and after a refusal admission waits for a release.
        while let (Some(&slot), Some(w)) = (free_slots.last(), queue.front()) {
            let job = w.job;
            let len = w.done.max(job.prompt);
            if !running.is_empty() && (admission_blocked || !cache.room_for(len)) {
                break;
            }
            let mut seq = cache.seq(job.id, slot);
            match cache.extend(&mut seq, len) {
                Ok(()) => {
                    let w = queue.pop_front().expect("front exists");
                    free_slots.pop();
                    st.recomputed_tokens += w.done as u64;
                    running.push(Running { job, seq });
                    progress = true;
                }
                Err(e) if is_capacity(&e) => {
                    st.note_refusal(&e);
                    cache.release(&mut seq)?;
                    admission_blocked = true;
                    if running.is_empty() {
                        return Err(too_big(cache, &job, &e));
                    }
                    break;
                }
                Err(e) => return Err(format!("admitting request {}: {e}", job.id)),
            }
        }

        // Decode: each running request generates one token.
        let order: Vec<u64> = running.iter().map(|r| r.job.id).collect();
        for id in order {
            // Gone from `running` when preempted earlier in this step.
            while let Some(i) = running.iter().position(|r| r.job.id == id) {
                let r = &mut running[i];
                if r.seq.tokens >= r.job.total {
                    break;
                }
                let next = r.seq.tokens + 1;
                match cache.extend(&mut r.seq, next) {
                    Ok(()) => {
                        progress = true;
                        break;
                    }
                    Err(e) if is_capacity(&e) => {
                        st.note_refusal(&e);
                        let Some(v) = running.iter().rposition(|r| r.job.id != id) else {
                            let job = running[i].job;
                            return Err(too_big(cache, &job, &e));
                        };
                        let mut victim = running.remove(v);
                        check(cache, &victim.seq, &mut st);
                        let done = victim.seq.tokens;
                        cache.release(&mut victim.seq)?;
                        free_slots.push(victim.seq.slot);
                        queue.push_front(Waiting {
                            job: victim.job,
                            done,
                        });
                        st.preemptions += 1;
                        admission_blocked = false;
                    }
                    Err(e) => return Err(format!("growing request {id}: {e}")),
                }
            }
        }

        // Memory in use at the fullest point of the step.
        let used: usize = running
            .iter()
            .map(|r| r.seq.tokens as usize * token_bytes_all)
            .sum();
        let mapped = cache.mapped_bytes;
        if mapped > st.peak_mapped {
            st.peak_mapped = mapped;
            st.used_at_peak = used;
        }
        st.sum_mapped += mapped as u128;
        st.sum_unused += (mapped - used) as u128;

        // Finish: verify, unmap, free the slot.
        let mut i = 0;
        while i < running.len() {
            if running[i].seq.tokens < running[i].job.total {
                i += 1;
                continue;
            }
            let mut r = running.remove(i);
            check(cache, &r.seq, &mut st);
            cache.release(&mut r.seq)?;
            free_slots.push(r.seq.slot);
            st.served += 1;
            admission_blocked = false;
            st.prompt_tokens += r.job.prompt as u64;
            st.generated_tokens += (r.job.total - r.job.prompt) as u64;
            progress = true;
        }
        observe(&StepView {
            step: st.steps,
            served: st.served,
            tokens_served: st.prompt_tokens + st.generated_tokens,
            mapped: cache.mapped_bytes,
            used: running
                .iter()
                .map(|r| r.seq.tokens as usize * token_bytes_all)
                .sum(),
            busy_slots: running.len(),
            objects: cache.created.iter().sum(),
        });
        if !progress {
            return Err(format!(
                "no progress in step {} ({} waiting, {} running): a scheduler bug",
                st.steps,
                queue.len(),
                running.len()
            ));
        }
    }
    st.wall = start.elapsed();
    Ok(st)
}

/// Verifies `seq`, counting checked tags and keeping the first bad one.
fn check(cache: &KvCache, seq: &Seq, st: &mut Stats) {
    match cache.verify(seq) {
        Ok(n) => st.tags_checked += n,
        Err(bad) => {
            st.failed_checks += 1;
            st.first_bad.get_or_insert(bad);
        }
    }
}
