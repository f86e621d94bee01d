//! Following runs: the loop under `run`, and the `wait` tool (with `idle_s`).
//!
//! Each look waits on the host (`agent-run wait --timeout`), so a run that ends is seen at once;
//! looks are at most 5 s apart, 1 s with a progress token or an `idle_s`, and never closer than
//! [`MIN_LOOK`] when a host answers at once.

use super::progress::{self, Progress};
use super::{Answer, Inner, MIN_LOOK};
use crate::host::Host;
use crate::probe::{look, probe, Look, Probe, Read};
use crate::tools::{self, IdsArgs};
use crate::view;
use rmcp::service::{RequestContext, RoleServer};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The longest look.
const LONG_LOOK: Duration = Duration::from_secs(5);
/// The longest look when someone is watching closely (progress, idle_s).
const SHORT_LOOK: Duration = Duration::from_secs(1);
/// The bytes of each log's end read for a progress line.
const TAIL_FOR_PROGRESS: u64 = 512;

/// How a watch ended.
pub(super) enum Watched {
    /// The run is final.
    Final,
    /// The time was up first; the last look at it.
    Going(Box<Probe>),
    /// The caller went away (the request was cancelled, or the server is shutting down).
    Aborted,
}

/// When each run last wrote, as the sizes of its logs say.
struct Silence {
    sizes: Vec<(u64, u64)>,
    since: Vec<Instant>,
}

impl Silence {
    /// The clocks start at the call.
    fn new(n: usize, t0: Instant) -> Silence {
        Silence {
            sizes: vec![(0, 0); n],
            since: vec![t0; n],
        }
    }

    /// A look: a run whose logs changed size wrote something.
    fn saw(&mut self, sizes: &[(u64, u64)], now: Instant) {
        for (i, s) in sizes.iter().enumerate() {
            if *s != self.sizes[i] {
                self.sizes[i] = *s;
                self.since[i] = now;
            }
        }
    }

    fn silent_for(&self, i: usize, now: Instant) -> Duration {
        now.saturating_duration_since(self.since[i])
    }
}

/// How long the next look may wait on the host.
fn step(deadline: Instant, close: bool) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .min(if close { SHORT_LOOK } else { LONG_LOOK })
}

/// A look that came back at once (a host that refuses to wait) must not become a busy loop.
async fn pace(since: Instant) {
    if since.elapsed() < MIN_LOOK {
        tokio::time::sleep(MIN_LOOK - since.elapsed()).await;
    }
}

/// Await `look`, sending a progress heartbeat whenever one falls due meanwhile (a look over
/// ssh may take a while); None when `ct` ends the call first.
async fn beating<T>(
    look: impl std::future::Future<Output = T>,
    mut progress: Option<&mut Progress>,
    ct: &CancellationToken,
) -> Option<T> {
    tokio::pin!(look);
    loop {
        let due = progress.as_ref().map(|p| p.until_due());
        tokio::select! {
            r = &mut look => return Some(r),
            _ = ct.cancelled() => return None,
            _ = async {
                match due {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some(p) = progress.as_mut() {
                    p.beat().await;
                }
            }
        }
    }
}

impl Inner {
    /// Follow a run until it is final, `limit` is up, or `ct` is cancelled; with `progress`,
    /// notify as it goes.
    pub(super) async fn watch(
        &self,
        host: &Host,
        id: &str,
        limit: Duration,
        mut progress: Option<&mut Progress>,
        ct: &CancellationToken,
    ) -> Result<Watched, String> {
        let deadline = Instant::now() + limit;
        let what = format!("run {id} on {}", host.name);
        // With progress, the first look does not wait: its line is the first after the start.
        let mut quick = progress.is_some();
        loop {
            let t0 = Instant::now();
            let step = if std::mem::take(&mut quick) {
                Duration::ZERO
            } else {
                step(deadline, progress.is_some())
            };
            let reads = match progress {
                Some(_) => (
                    Read::Tail {
                        bytes: TAIL_FOR_PROGRESS,
                    },
                    Read::Tail {
                        bytes: TAIL_FOR_PROGRESS,
                    },
                ),
                None => (Read::Size, Read::Size),
            };
            let look = probe(host, id, (!step.is_zero()).then_some(step), reads);
            let Some(got) = beating(look, progress.as_deref_mut(), ct).await else {
                return Ok(Watched::Aborted);
            };
            let p = match got {
                Ok(p) => p,
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!(
                        "{e}; run {id} goes on there under its lease and timeout: ask again with status or wait"
                    ))
                }
                Err(_) => {
                    let rest = deadline.saturating_duration_since(Instant::now());
                    tokio::select! {
                        _ = tokio::time::sleep(SHORT_LOOK.min(rest)) => {}
                        _ = ct.cancelled() => return Ok(Watched::Aborted),
                    }
                    continue;
                }
            };
            if let Some(pg) = progress.as_mut() {
                pg.after_look(&what, &p).await;
            }
            match &p.record {
                Ok(r) => self.keeper.observe(&host.name, r),
                Err((_, msg)) => return Err(format!("{what}: {msg}")),
            }
            if p.is_final() {
                return Ok(Watched::Final);
            }
            if Instant::now() >= deadline {
                return Ok(Watched::Going(Box::new(p)));
            }
            pace(t0).await;
        }
    }

    pub(super) async fn wait(&self, a: IdsArgs, ctx: &RequestContext<RoleServer>) -> Answer {
        let ids = a.ids()?;
        let limit = tools::wait_bound("timeout_s", a.timeout_s)?;
        let idle = a.idle()?;
        let tail = tools::bytes("tail_bytes", a.tail_bytes, 2048)?;
        let host = self.host(a.host.as_deref())?;
        let t0 = Instant::now();
        let deadline = t0 + limit;
        let first = match ids.as_slice() {
            [id] => format!("waiting for run {id} on {}", host.name),
            _ => format!("waiting for {} runs on {}", ids.len(), host.name),
        };
        let mut progress = ctx
            .meta
            .get_progress_token()
            .map(|t| Progress::new(ctx.peer.clone(), t, limit, self.progress_every, first));
        let mut silence = Silence::new(ids.len(), t0);
        let mut quick = progress.is_some();
        let silent = loop {
            let started = Instant::now();
            let step = if std::mem::take(&mut quick) {
                Duration::ZERO
            } else {
                step(deadline, progress.is_some() || idle.is_some())
            };
            let l = look(&host, &ids, (!step.is_zero()).then_some(step), a.any);
            let Some(l) = beating(l, progress.as_mut(), &ctx.ct).await else {
                return Err("wait cancelled with its request (the runs go on)".into());
            };
            let l = l?;
            let now = Instant::now();
            silence.saw(&l.sizes, now);
            for r in &l.records {
                self.keeper.observe(&host.name, r);
            }
            // An entry without a state (no such run, a refused record) counts as done: it will
            // not become final by waiting.
            let done: Vec<bool> = l
                .records
                .iter()
                .map(|r| r["final"].as_bool() == Some(true) || r["state"].is_null())
                .collect();
            let silent: Vec<Option<Duration>> = (0..ids.len())
                .map(|i| {
                    let s = silence.silent_for(i, now);
                    (!done[i] && idle.is_some_and(|d| s >= d)).then_some(s)
                })
                .collect();
            let ready = done.iter().zip(&silent).map(|(d, s)| *d || s.is_some());
            let over = if a.any {
                ready.clone().any(|r| r)
            } else {
                ready.clone().all(|r| r)
            };
            if let Some(p) = progress.as_mut() {
                let bytes = l.sizes.iter().fold((0, 0), |t, s| (t.0 + s.0, t.1 + s.1));
                p.saw(bytes, wait_line(&host.name, &ids, &l, bytes)).await;
            }
            if over || now >= deadline {
                break silent;
            }
            pace(started).await;
        };
        let mut views = self.views(&host, &ids, Some(tail), a.verbose).await;
        for (v, s) in views.iter_mut().zip(silent) {
            if let (Ok(v), Some(s)) = (v, s) {
                v.mark_idle(s);
            }
        }
        self.views_answer(&host, views)
    }
}

/// The progress line of a `wait`.
fn wait_line(host: &str, ids: &[String], l: &Look, bytes: (u64, u64)) -> String {
    if let [id] = ids {
        let summary = view::summary(&l.records[0]);
        return format!("run {id} on {host}: {summary}; {}", progress::output(bytes));
    }
    let finals = l
        .records
        .iter()
        .filter(|r| r["final"].as_bool() == Some(true))
        .count();
    format!(
        "waiting for {} runs on {host}: {finals} final, {} not; {}",
        ids.len(),
        ids.len() - finals,
        progress::output(bytes)
    )
}
