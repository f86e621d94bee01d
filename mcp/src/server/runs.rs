//! The tools that read or stop runs by id: `status`, `cancel`, `logs`, `list`.

use super::{Answer, Inner, CANCEL_TIMEOUT};
use crate::host::{Call, Host};
use crate::keeper::OWNER_LABEL;
use crate::probe::{probe, Read};
use crate::tools::{self, IdsArgs, ListArgs, LogsArgs};
use crate::view::{self, RunError, RunView, Runs};
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
#[derive(Serialize)]
struct LogsView {
    run_id: String,
    host: String,
    stream: String,
    offset: u64,
    next_offset: u64,
    size: u64,
    more: bool,
    #[serde(rename = "final")]
    is_final: bool,
    state: String,
    text: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    lossy: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

#[derive(Serialize)]
struct ListView {
    host: String,
    count: usize,
    runs: Vec<Value>,
}

#[derive(Serialize)]
struct Cancelled {
    host: String,
    took_ms: u64,
    runs: Vec<Value>,
}

impl Inner {
    /// Views of several runs (or one), each probed with `tail` bytes of each log.
    pub(super) async fn views(
        &self,
        host: &Arc<Host>,
        ids: &[String],
        tail: Option<u64>,
        verbose: bool,
    ) -> Vec<Result<RunView, RunError>> {
        let reads = match tail {
            Some(b) => (Read::Tail { bytes: b }, Read::Tail { bytes: b }),
            None => (Read::Size, Read::Size),
        };
        let work = ids.iter().map(|id| {
            let host = host.clone();
            async move {
                let err = |e: String| RunError {
                    run_id: id.clone(),
                    host: host.name.clone(),
                    state: None,
                    error: e,
                };
                let p = probe(&host, id, None, reads).await.map_err(err)?;
                match &p.record {
                    Ok(r) => {
                        self.keeper.observe(&host.name, r);
                        let owned = verbose.then(|| self.keeper.owns(&host.name, id));
                        let mut v = view::run(&host.name, r.clone(), Some(&p), owned);
                        if tail.is_none() {
                            // Sizes only.
                            for s in [&mut v.stdout, &mut v.stderr].into_iter().flatten() {
                                s.shown_from = s.bytes;
                            }
                        }
                        Ok(v)
                    }
                    Err((_, msg)) => Err(err(msg.clone())),
                }
            }
        });
        futures::future::join_all(work).await
    }

    /// One view as the answer, or several in one document.
    pub(super) fn views_answer(
        &self,
        host: &Host,
        mut views: Vec<Result<RunView, RunError>>,
    ) -> Answer {
        if views.len() == 1 {
            return match views.pop() {
                Some(Ok(v)) => {
                    let failed = v.state == "launch_failed";
                    Ok(view::answer(&v, failed).into())
                }
                Some(Err(e)) => Err(format!("run {} on {}: {}", e.run_id, e.host, e.error)),
                None => Err("no run".into()),
            };
        }
        let runs: Vec<Value> = views
            .into_iter()
            .map(|v| match v {
                Ok(v) => serde_json::to_value(v).unwrap_or_default(),
                Err(e) => serde_json::to_value(e).unwrap_or_default(),
            })
            .collect();
        Ok(view::answer(
            &Runs {
                host: host.name.clone(),
                runs,
            },
            false,
        )
        .into())
    }

    pub(super) async fn status(&self, a: IdsArgs) -> Answer {
        a.only_for("status")?;
        let ids = a.ids()?;
        let host = self.host(a.host.as_deref())?;
        let views = self.views(&host, &ids, None, a.verbose).await;
        self.views_answer(&host, views)
    }

    /// `agent-run cancel --json IDS` on `host`: the final records (or error entries).
    pub(super) async fn cancel_runs(
        &self,
        host: &Host,
        ids: &[String],
    ) -> Result<Vec<Value>, String> {
        let mut w = vec!["cancel", "--json"];
        w.extend(ids.iter().map(String::as_str));
        let reply = host.agent_run(&w, CANCEL_TIMEOUT, Call::Plain).await?;
        for id in ids {
            self.keeper.release(&host.name, id);
        }
        crate::say(&format!(
            "cancel of {} on {}: exit {}",
            ids.join(", "),
            host.name,
            reply.code.map_or("?".into(), |c| c.to_string())
        ));
        match serde_json::from_slice::<Value>(&reply.stdout) {
            Ok(Value::Array(a)) => Ok(a),
            Ok(v @ Value::Object(_)) => Ok(vec![v]),
            _ => Err(format!(
                "cancel of {} on {} (exit {}): {}",
                ids.join(", "),
                host.name,
                reply.code.map_or("?".into(), |c| c.to_string()),
                reply.stderr_text()
            )),
        }
    }

    pub(super) async fn cancel(&self, a: IdsArgs) -> Answer {
        a.only_for("cancel")?;
        let ids = a.ids()?;
        let host = self.host(a.host.as_deref())?;
        let t0 = Instant::now();
        let records = self.cancel_runs(&host, &ids).await?;
        let took_ms = t0.elapsed().as_millis() as u64;
        let runs: Vec<Value> = records
            .into_iter()
            .map(|r| {
                if r["state"].is_null() {
                    return r;
                }
                let v = view::run(&host.name, r, None, a.verbose.then_some(false));
                serde_json::to_value(v).unwrap_or_default()
            })
            .collect();
        let failed = runs.iter().all(|r| r["state"].is_null());
        Ok(view::answer(
            &Cancelled {
                host: host.name.clone(),
                took_ms,
                runs,
            },
            failed,
        )
        .into())
    }

    pub(super) async fn logs(&self, a: LogsArgs) -> Answer {
        let id = tools::run_id(&a.run_id)?;
        let host = self.host(a.host.as_deref())?;
        let stream = a.stream.as_deref().unwrap_or("stdout");
        let which = match stream {
            "stdout" => 0,
            "stderr" => 1,
            other => return Err(format!("stream is stdout or stderr, not {other:?}")),
        };
        let read = match (a.offset, a.tail_bytes, a.max_bytes) {
            (Some(_), Some(_), _) => return Err("give offset or tail_bytes, not both".into()),
            (None, _, Some(_)) => {
                return Err("max_bytes goes with offset (tail_bytes without it)".into())
            }
            (Some(offset), None, max) => {
                let max = tools::bytes("max_bytes", max, 16384)?;
                if max == 0 {
                    return Err("max_bytes must be at least 1".into());
                }
                Read::From { offset, max }
            }
            (None, t, None) => Read::Tail {
                bytes: tools::bytes("tail_bytes", t, tools::DEFAULT_TAIL)?,
            },
        };
        let reads = if which == 0 {
            (read, Read::Size)
        } else {
            (Read::Size, read)
        };
        let p = probe(&host, &id, None, reads).await?;
        let record = p
            .record
            .as_ref()
            .map_err(|(_, m)| format!("run {id} on {}: {m}", host.name))?;
        self.keeper.observe(&host.name, record);
        let c = if which == 0 { &p.stdout } else { &p.stderr };
        let sv = view::StreamView::of(c);
        let doc = LogsView {
            run_id: id,
            host: host.name.clone(),
            stream: stream.to_string(),
            offset: c.offset,
            next_offset: c.end(),
            size: c.size,
            more: c.end() < c.size,
            is_final: record["final"].as_bool() == Some(true),
            state: record["state"].as_str().unwrap_or("?").to_string(),
            text: sv.text,
            lossy: sv.lossy,
            file: sv.file,
        };
        Ok(view::answer(&doc, false).into())
    }

    pub(super) async fn list(&self, a: ListArgs) -> Answer {
        let host = self.host(a.host.as_deref())?;
        let mut w: Vec<String> = vec!["list".into(), "--json".into()];
        if let Some(s) = &a.state {
            let states = tools::list_states();
            if !states.contains(&s.as_str()) {
                return Err(format!("state is one of {}, not {s:?}", states.join(", ")));
            }
            w.push(format!("--state={s}"));
        }
        for (k, v) in &a.labels {
            let sel = if v == "*" {
                agent_run_shared::spec::parse_label(&format!("{k}=x"))
                    .map_err(|e| e.to_string())?;
                k.clone()
            } else {
                let (k, v) = agent_run_shared::spec::parse_label(&format!("{k}={v}"))
                    .map_err(|e| e.to_string())?;
                format!("{k}={v}")
            };
            w.push(format!("--label={sel}"));
        }
        if a.mine {
            w.push(format!("--label={OWNER_LABEL}={}", self.keeper.owner));
        }
        let limit = a.limit.unwrap_or(20);
        if !(1..=200).contains(&limit) {
            return Err(format!("limit is 1 to 200, not {limit}"));
        }
        w.push(format!("--limit={limit}"));
        let reply = host
            .agent_run(&w, Duration::from_secs(60), Call::Plain)
            .await?;
        let Ok(Value::Array(mut runs)) = serde_json::from_slice::<Value>(&reply.stdout) else {
            return Err(format!(
                "list on {} (exit {}): {}",
                host.name,
                reply.code.map_or("?".into(), |c| c.to_string()),
                reply.stderr_text()
            ));
        };
        for r in &mut runs {
            let id = r["run_id"].as_str().unwrap_or_default().to_string();
            if let Value::Object(m) = r {
                m.insert(
                    "owned_by_this_server".into(),
                    Value::Bool(self.keeper.owns(&host.name, &id)),
                );
            }
        }
        let doc = ListView {
            host: host.name.clone(),
            count: runs.len(),
            runs,
        };
        Ok(view::answer(&doc, false).into())
    }
}
