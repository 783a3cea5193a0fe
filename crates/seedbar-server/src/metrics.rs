//! Prometheus metrics (`GET /metrics`): request counts by route and status, prompt and
//! generated tokens, running and queued rows, the engines' steps and speculative decoding's
//! drafted and kept tokens, the prompt cache's disk tier, and latency histograms, written in the text exposition format.

use std::{
    collections::BTreeMap,
    fmt::Write,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::Duration,
};

use seedbar_scheduler::DiskCacheStats;

/// Upper bounds (seconds) shared by both latency histograms.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|&b| seconds <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(value.as_micros() as u64, Ordering::Relaxed);
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bound, count) in BUCKETS.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
}

/// Engine gauges and counters read at scrape time (the counters are the loaded models',
/// since each was loaded).
pub struct Gauges {
    pub running_rows: usize,
    pub queued_requests: usize,
    pub loaded_models: usize,
    pub engine_steps: u64,
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    pub model_drafted_tokens: u64,
    /// The prompt cache's disk tier (`None` when off).
    pub disk_cache: Option<DiskCacheGauges>,
}

/// What the prompt cache's disk tier has done since the server started, and holds now.
pub struct DiskCacheGauges {
    pub hits: u64,
    pub writes: u64,
    pub rejected: u64,
    pub bytes: u64,
}

impl From<&DiskCacheStats> for DiskCacheGauges {
    fn from(stats: &DiskCacheStats) -> Self {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        DiskCacheGauges {
            hits: read(&stats.hits),
            writes: read(&stats.writes),
            rejected: read(&stats.rejected),
            bytes: read(&stats.bytes),
        }
    }
}

impl Metrics {
    pub fn count_request(&self, route: &str, status: u16) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests.entry((route.to_string(), status)).or_default() += 1;
    }

    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::new();
        out.push_str("# HELP seedbar_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE seedbar_requests_total counter\n");
        for ((route, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "seedbar_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let counters = [
            (
                "seedbar_prompt_tokens_total",
                "Prompt tokens received.",
                &self.prompt_tokens,
            ),
            (
                "seedbar_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
        ];
        let engine_counters = [
            (
                "seedbar_engine_steps_total",
                "Engine steps run (generated tokens over steps: tokens per step).",
                gauges.engine_steps,
            ),
            (
                "seedbar_drafted_tokens_total",
                "Tokens drafted by speculative decoding (prompt lookup or a draft model).",
                gauges.drafted_tokens,
            ),
            (
                "seedbar_model_drafted_tokens_total",
                "Of the drafted tokens, those a draft model drafted.",
                gauges.model_drafted_tokens,
            ),
            (
                "seedbar_accepted_draft_tokens_total",
                "Drafted tokens verification kept (over drafted: the acceptance rate).",
                gauges.accepted_tokens,
            ),
        ];
        let disk = gauges.disk_cache.as_ref();
        let disk_counters = disk.into_iter().flat_map(|d| {
            [
                (
                    "seedbar_prompt_cache_disk_hits_total",
                    "Requests whose prompt's KV was read from the disk cache.",
                    d.hits,
                ),
                (
                    "seedbar_prompt_cache_disk_writes_total",
                    "Sequences' KV written to the disk cache.",
                    d.writes,
                ),
                (
                    "seedbar_prompt_cache_disk_rejected_total",
                    "Disk cache files found torn or altered, and removed.",
                    d.rejected,
                ),
            ]
        });
        let counters = counters
            .into_iter()
            .map(|(name, help, value)| (name, help, value.load(Ordering::Relaxed)))
            .chain(engine_counters)
            .chain(disk_counters);
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let gauges = [
            (
                "seedbar_running_rows",
                "Requests generating now.",
                gauges.running_rows,
            ),
            (
                "seedbar_queued_requests",
                "Requests waiting for a row.",
                gauges.queued_requests,
            ),
            (
                "seedbar_loaded_models",
                "Models in memory.",
                gauges.loaded_models,
            ),
        ];
        let disk_bytes = disk.map(|d| {
            (
                "seedbar_prompt_cache_disk_bytes",
                "Bytes of the disk cache's files.",
                d.bytes as usize,
            )
        });
        for (name, help, value) in gauges.into_iter().chain(disk_bytes) {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        self.time_to_first_token.write(
            &mut out,
            "seedbar_time_to_first_token_seconds",
            "Time from request to its first token.",
        );
        self.inter_token_latency.write(
            &mut out,
            "seedbar_inter_token_latency_seconds",
            "Time between consecutive tokens of a stream.",
        );
        out
    }
}
