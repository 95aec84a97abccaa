//! The process metrics, under the names every Prometheus client library uses for them
//! (`process_*`, without the `slotgate_` prefix), so the usual dashboards and alerts work:
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `process_cpu_seconds_total` | counter | user and system CPU time spent, in seconds |
//! | `process_resident_memory_bytes` | gauge | resident set size |
//! | `process_virtual_memory_bytes` | gauge | virtual memory size |
//! | `process_open_fds` | gauge | open file descriptors |
//! | `process_max_fds` | gauge | the soft limit on open file descriptors |
//! | `process_start_time_seconds` | gauge | when the process started, in seconds since the Unix epoch |
//!
//! `prometheus-client` has no process collector, so [`ProcessCollector`] reads them from
//! `/proc/self` at scrape time (a few small files; a scrape is not the hot path). Where `/proc`
//! cannot be read (not Linux), the series are absent rather than wrong. The CPU clock's tick
//! rate comes from the process's auxiliary vector (`AT_CLKTCK`), which is what `sysconf` reads,
//! so no `unsafe` call is needed.

use std::fs;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Reads the process metrics from `/proc/self` at each scrape; see the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector;

/// One reading of the process.
#[derive(Debug, Default, PartialEq)]
struct Reading {
    cpu_seconds: Option<f64>,
    resident_bytes: Option<u64>,
    virtual_bytes: Option<u64>,
    open_fds: Option<u64>,
    max_fds: Option<u64>,
    start_time_seconds: Option<f64>,
}

/// `AT_CLKTCK` in the auxiliary vector: the tick rate of `/proc/*/stat`'s times.
const AT_CLKTCK: usize = 17;
/// `USER_HZ` on every architecture Linux runs Rust on, for when the auxiliary vector cannot be
/// read.
const DEFAULT_CLOCK_TICKS: u64 = 100;

impl Reading {
    /// Reads what `/proc` tells; what it does not stays `None`.
    fn now() -> Self {
        let ticks = fs::read("/proc/self/auxv")
            .ok()
            .and_then(|auxv| clock_ticks(&auxv))
            .unwrap_or(DEFAULT_CLOCK_TICKS);
        let stat = fs::read_to_string("/proc/self/stat").ok();
        let stat = stat.as_deref().and_then(Stat::parse);
        let boot_time = fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|text| boot_time(&text));
        #[expect(
            clippy::cast_precision_loss,
            reason = "tick counts stay far below 2^53 for any process's lifetime"
        )]
        let seconds = |ticks_now: u64| ticks_now as f64 / ticks as f64;
        Self {
            cpu_seconds: stat.map(|s| seconds(s.utime + s.stime)),
            resident_bytes: fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|text| resident_bytes(&text)),
            virtual_bytes: stat.map(|s| s.vsize),
            open_fds: fs::read_dir("/proc/self/fd")
                .ok()
                .map(|dir| u64::try_from(dir.count()).unwrap_or(u64::MAX)),
            max_fds: fs::read_to_string("/proc/self/limits")
                .ok()
                .and_then(|text| max_open_files(&text)),
            start_time_seconds: stat
                .zip(boot_time)
                .map(|(s, boot)| Duration::from_secs(boot).as_secs_f64() + seconds(s.starttime)),
        }
    }
}

/// The fields of `/proc/self/stat` used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    starttime: u64,
    vsize: u64,
}

impl Stat {
    /// Parses `/proc/PID/stat` (proc(5)): the command name is in parentheses and may hold
    /// spaces and parentheses itself, so the fields are counted from the last `)`.
    fn parse(text: &str) -> Option<Self> {
        let (_, rest) = text.rsplit_once(')')?;
        // Field 3 (`state`) is the first after the name.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Self {
            utime: field(14)?,
            stime: field(15)?,
            starttime: field(22)?,
            vsize: field(23)?,
        })
    }
}

/// `AT_CLKTCK` from an auxiliary vector (pairs of native words).
fn clock_ticks(auxv: &[u8]) -> Option<u64> {
    const WORD: usize = std::mem::size_of::<usize>();
    auxv.chunks_exact(2 * WORD).find_map(|pair| {
        let key = usize::from_ne_bytes(pair[..WORD].try_into().ok()?);
        let value = usize::from_ne_bytes(pair[WORD..].try_into().ok()?);
        (key == AT_CLKTCK && value > 0).then(|| u64::try_from(value).ok())?
    })
}

/// `btime` of `/proc/stat`: the boot time, in seconds since the epoch.
fn boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

/// `VmRSS` of `/proc/self/status`, in bytes (the file says kB).
fn resident_bytes(text: &str) -> Option<u64> {
    let value = text.lines().find_map(|line| line.strip_prefix("VmRSS:"))?;
    let kib: u64 = value.trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// The soft limit of `Max open files` in `/proc/self/limits`; `None` when unlimited.
fn max_open_files(text: &str) -> Option<u64> {
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))?;
    line.split_whitespace().next()?.parse().ok()
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let reading = Reading::now();
        if let Some(seconds) = reading.cpu_seconds {
            let counter = ConstCounter::new(seconds);
            let metric = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        let gauges: [(&str, &str, Option<u64>); 4] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                reading.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                reading.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                reading.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                reading.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        if let Some(start) = reading.start_time_seconds {
            let gauge = ConstGauge::new(start);
            let metric = encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                None,
                gauge.metric_type(),
            )?;
            gauge.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Reading, Stat, boot_time, clock_ticks, max_open_files, resident_bytes};

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis, as proc(5) warns.
        let text = "4242 (slot gate) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 50 0 0 20 0 9 0 123456 987654321 2048 18446744073709551615";
        let stat = Stat::parse(text).unwrap();
        assert_eq!(
            stat,
            Stat {
                utime: 250,
                stime: 50,
                starttime: 123_456,
                vsize: 987_654_321
            }
        );
        assert_eq!(Stat::parse("12 (cut short) S 1"), None);
    }

    #[test]
    fn the_small_files_are_read_as_proc_5_writes_them() {
        assert_eq!(
            boot_time("cpu 1 2 3\nbtime 1700000000\nprocesses 9\n"),
            Some(1_700_000_000)
        );
        assert_eq!(
            resident_bytes("Name:\tslotgate\nVmRSS:\t   10240 kB\n"),
            Some(10_485_760)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            20000                20000                files\n";
        assert_eq!(max_open_files(limits), Some(20_000));
        assert_eq!(
            max_open_files(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
        let word = std::mem::size_of::<usize>();
        let mut auxv = Vec::new();
        for (key, value) in [(6_usize, 4096_usize), (17, 250), (0, 0)] {
            auxv.extend_from_slice(&key.to_ne_bytes());
            auxv.extend_from_slice(&value.to_ne_bytes());
        }
        assert_eq!(auxv.len(), 6 * word);
        assert_eq!(clock_ticks(&auxv), Some(250));
        assert_eq!(clock_ticks(&auxv[..2 * word]), None);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn this_process_reads_whole() {
        let reading = Reading::now();
        assert!(reading.resident_bytes.unwrap() > 0, "{reading:?}");
        assert!(reading.open_fds.unwrap() > 0, "{reading:?}");
        assert!(reading.cpu_seconds.unwrap() >= 0.0, "{reading:?}");
        assert!(reading.start_time_seconds.unwrap() > 1.5e9, "{reading:?}");
        assert!(reading.virtual_bytes.unwrap() >= reading.resident_bytes.unwrap());
    }
}
