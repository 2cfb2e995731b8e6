//! The demo's request stream: a replayed Azure LLM inference trace, or a seeded synthetic stream
//! shaped like that trace's conversation service.
//!
//! Trace data: Azure LLM inference trace 2023 (CC-BY 4.0), Patel et al., "Splitwise: Efficient
//! generative LLM inference using phase splitting", ISCA 2024. It is read from
//! `../shared/data/azure-llm-inference-2023/`, never copied into this repository.

use std::path::Path;

/// The attribution the trace's licence asks for, printed whenever a trace is used.
pub const TRACE_ATTRIBUTION: &str =
    "Azure LLM inference trace 2023 (CC-BY 4.0), Patel et al., Splitwise, ISCA 2024";

/// One request: prompt tokens (arrive at once) and tokens to generate (one per step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub prompt: u32,
    pub output: u32,
}

/// Reads the first `limit` requests of a CSV in the Azure LLM inference trace format
/// (`TIMESTAMP,ContextTokens,GeneratedTokens` with a header line), in file order, which is the
/// trace's arrival order. Rows of 0 prompt or 0 output tokens are kept as they are
/// ([`ZeroRows`] counts them for the report).
pub fn read_trace(path: &Path, limit: usize) -> Result<Vec<Request>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read trace {}: {e}", path.display()))?;
    parse_trace(&text, limit).map_err(|e| format!("trace {}: {e}", path.display()))
}

/// Parses trace text (see [`read_trace`]).
pub fn parse_trace(text: &str, limit: usize) -> Result<Vec<Request>, String> {
    let mut lines = text.lines().enumerate();
    let header = lines.next().map(|(_, l)| l.trim()).unwrap_or("");
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let find = |name: &str| cols.iter().position(|c| c.eq_ignore_ascii_case(name));
    let (Some(ctx_col), Some(gen_col)) = (find("ContextTokens"), find("GeneratedTokens")) else {
        return Err(format!(
            "line 1: header {header:?} lacks ContextTokens and GeneratedTokens \
             (expected TIMESTAMP,ContextTokens,GeneratedTokens)"
        ));
    };
    let mut out = Vec::new();
    for (i, line) in lines {
        if out.len() >= limit {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let num = |col: usize, what: &str| -> Result<u32, String> {
            let f = fields
                .get(col)
                .ok_or_else(|| format!("line {}: {what} missing in {line:?}", i + 1))?;
            f.parse::<u32>()
                .map_err(|_| format!("line {}: {what} {f:?} is not a token count", i + 1))
        };
        out.push(Request {
            prompt: num(ctx_col, "ContextTokens")?,
            output: num(gen_col, "GeneratedTokens")?,
        });
    }
    if out.is_empty() {
        return Err("no requests after the header".into());
    }
    Ok(out)
}

/// The requests of a trace with 0 prompt tokens and with 0 output tokens, by index (the request
/// ids of the replay, 0-based in file order). They are served as they are: a request of 0
/// prompt tokens starts with an empty KV cache (its first entry is its first generated token);
/// one of 0 output tokens is its prompt only.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ZeroRows {
    pub prompt: Vec<usize>,
    pub output: Vec<usize>,
}

impl ZeroRows {
    pub fn of(reqs: &[Request]) -> ZeroRows {
        let ids = |f: fn(&Request) -> bool| {
            reqs.iter()
                .enumerate()
                .filter(|(_, r)| f(r))
                .map(|(i, _)| i)
                .collect()
        };
        ZeroRows {
            prompt: ids(|r| r.prompt == 0),
            output: ids(|r| r.output == 0),
        }
    }

    /// `3 with 0 prompt tokens (requests 1, 5, 9), ...`, or `None` when there are none.
    pub fn describe(&self) -> Option<String> {
        let list = |v: &[usize]| {
            let mut s: Vec<String> = v.iter().take(5).map(|i| i.to_string()).collect();
            if v.len() > 5 {
                s.push("...".into());
            }
            let noun = if v.len() == 1 { "request" } else { "requests" };
            format!("{noun} {}", s.join(", "))
        };
        let mut parts = Vec::new();
        if !self.prompt.is_empty() {
            parts.push(format!(
                "{} with 0 prompt tokens ({}; served with an empty prompt, not as 1 token)",
                self.prompt.len(),
                list(&self.prompt)
            ));
        }
        if !self.output.is_empty() {
            parts.push(format!(
                "{} with 0 output tokens ({}; served as the prompt alone)",
                self.output.len(),
                list(&self.output)
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// splitmix64 (Steele, Lea, Flood 2014): a small, good, seedable generator; no dependency.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }

    /// Uniform in (0, 1): never 0, so its logarithm is finite.
    pub fn next_f64(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn next_normal(&mut self) -> f64 {
        let (u1, u2) = (self.next_f64(), self.next_f64());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// splitmix64's finaliser: a bijective 64-bit mix.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Log-normal parameters fitted to the conversation trace (`conv.csv`): prompt median 1,020
/// tokens (p90 2,734), output median 129 (p90 424, capped at 1,000 by the service); the longest
/// request is about 14,000 tokens in all.
const PROMPT_MEDIAN: f64 = 1000.0;
const PROMPT_SIGMA: f64 = 0.8;
const PROMPT_MAX: f64 = 13_000.0;
const OUTPUT_MEDIAN: f64 = 130.0;
const OUTPUT_SIGMA: f64 = 0.85;
const OUTPUT_MAX: f64 = 1_000.0;

/// `n` synthetic requests with the conversation trace's shape: log-normal prompt and output
/// lengths, clamped to [1, 13,000] and [1, 1,000] tokens (so at most 14,000 in all).
pub fn synthetic(n: usize, seed: u64) -> Vec<Request> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|_| {
            let p = (PROMPT_MEDIAN * (PROMPT_SIGMA * rng.next_normal()).exp())
                .round()
                .clamp(1.0, PROMPT_MAX);
            let o = (OUTPUT_MEDIAN * (OUTPUT_SIGMA * rng.next_normal()).exp())
                .round()
                .clamp(1.0, OUTPUT_MAX);
            Request {
                prompt: p as u32,
                output: o as u32,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn median(mut v: Vec<u32>) -> u32 {
        v.sort_unstable();
        v[v.len() / 2]
    }

    #[test]
    fn synthetic_stream_has_the_conversation_trace_medians_and_tail() {
        let r = synthetic(20_000, 7);
        let p = median(r.iter().map(|x| x.prompt).collect());
        let o = median(r.iter().map(|x| x.output).collect());
        assert!((900..=1100).contains(&p), "median prompt {p}");
        assert!((115..=145).contains(&o), "median output {o}");
        let longest = r.iter().map(|x| x.prompt + x.output).max().unwrap();
        assert!(
            (7_000..=14_000).contains(&longest),
            "longest request {longest} tokens"
        );
        assert!(r.iter().all(|x| x.prompt >= 1 && x.output >= 1));
    }

    #[test]
    fn synthetic_stream_is_reproducible_from_its_seed() {
        assert_eq!(synthetic(100, 3), synthetic(100, 3));
        assert_ne!(synthetic(100, 3), synthetic(100, 4));
    }

    #[test]
    fn trace_parses_by_header_names_and_stops_at_the_limit() {
        let t = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                 2023-11-16 18:15:46.6805900,374,44\n\
                 2023-11-16 18:15:50.9951690,0,109\n\
                 2023-11-16 18:15:51.2224670,879,55\n";
        let r = parse_trace(t, 2).unwrap();
        assert_eq!(
            r,
            vec![
                Request {
                    prompt: 374,
                    output: 44
                },
                Request {
                    prompt: 0,
                    output: 109
                }
            ]
        );
    }

    #[test]
    fn trace_with_bad_header_or_field_is_an_error_naming_the_line() {
        let e = parse_trace("a,b,c\n1,2,3\n", 10).unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\nx,12,y\n", 10).unwrap_err();
        assert!(e.contains("line 2") && e.contains("GeneratedTokens"), "{e}");
        let e = parse_trace("TIMESTAMP,ContextTokens,GeneratedTokens\n", 10).unwrap_err();
        assert!(e.contains("no requests"), "{e}");
    }
}
