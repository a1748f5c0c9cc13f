//! `difftx bench serve`: closed-loop load on an OpenAI-compatible completions server (difftx
//! serve, llama-server), the measurements of `bench/serve_load.py` from a client that costs
//! the server's cores little.
//!
//! On a machine whose cores the server and its load share, the client's own work per streamed
//! token (a Python thread taking the interpreter's lock to parse each event) is taken from the
//! server, and more from the faster one, which streams more events a second; its threads
//! waiting for that lock also stretch the times to first token it measures. Here each client
//! is an OS thread on a blocking socket: a read and a small JSON parse per event.
//!
//! Each of C clients sends a streaming completion of exactly `tokens` tokens (greedy, EOS
//! ignored where the server knows that field), reads the whole answer and sends the next, for
//! `seconds`. Per level:
//!
//! ```text
//! 1. start client i at i·stagger/C seconds; each loops until the level's end
//! 2. per request: time to first token, then each event's arrival and its tokens
//! 3. meanwhile (with a pid) the server's resident memory every `rss_every` seconds
//! 4. tokens/s over the window from the last client's start to the level's end; TTFT and
//!    per-token latency over the requests sent inside it
//! ```

use super::bench::status_kib;
use crate::error::{Error, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One level's load, the same for every level of a run but the client count.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// host:port of the server
    pub addr: String,
    pub tokens: usize,
    pub seconds: f64,
    /// the `model` field to send (llama-server ignores it)
    pub model: Option<String>,
    /// probability that a request hangs up after a random number of tokens (a cancellation)
    pub disconnect: f64,
    /// client i starts at i·stagger/C seconds; latencies count after the last one started
    pub stagger: f64,
    /// the server's process, for its resident memory
    pub pid: Option<u32>,
    pub rss_every: f64,
}

impl LoadOptions {
    /// A one-line refusal, naming the flag and its value, of options no level can run with
    /// (NaN and infinite times included: there is no infinite wait to time), and of a client
    /// count of 0 among `clients`.
    pub fn check(&self, clients: &[usize]) -> Result<()> {
        let within = |flag: &str, v: f64, ok: bool, want: &str| match ok && v.is_finite() {
            true => Ok(()),
            false => Err(Error::Invalid(format!("{flag} {v}: expected {want}"))),
        };
        let d = self.disconnect;
        within(
            "--disconnect",
            d,
            (0.0..=1.0).contains(&d),
            "a probability, in [0, 1]",
        )?;
        within(
            "--seconds",
            self.seconds,
            self.seconds > 0.0,
            "a finite number above 0",
        )?;
        within(
            "--stagger",
            self.stagger,
            self.stagger >= 0.0,
            "a finite number, at least 0",
        )?;
        within(
            "--rss-every",
            self.rss_every,
            self.rss_every > 0.0,
            "a finite number above 0",
        )?;
        if self.tokens == 0 || clients.contains(&0) {
            return Err(Error::Invalid(
                "--tokens and every count in --clients must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// What one level measured (the fields of `bench/serve_load.py`'s JSON).
#[derive(Clone, Debug, serde::Serialize)]
pub struct LevelReport {
    pub clients: usize,
    /// requests sent after the ramp that ran to their end
    pub requests: usize,
    /// tokens that arrived between the ramp's end and the level's end, over that window
    pub tokens_per_s: f64,
    pub generated: usize,
    pub wall_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub token_p50_ms: f64,
    pub token_p99_ms: f64,
    pub errors: usize,
    pub cancelled: usize,
    pub first_errors: Vec<String>,
    pub rss_mib_series: Vec<f64>,
    pub peak_rss_mib: Option<f64>,
}

/// "host:port" of an `http://host[:port][/]` URL (port 80 when absent).
pub fn parse_url(url: &str) -> Result<String> {
    let bad = || Error::Invalid(format!("--url {url}: expected http://HOST[:PORT]"));
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let hostport = rest.trim_end_matches('/');
    if hostport.is_empty() || hostport.contains('/') {
        return Err(bad());
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Ok(hostport.to_string()),
        Some(_) => Err(bad()),
        None => Ok(format!("{hostport}:80")),
    }
}

/// One streamed completion as the client saw it.
struct Outcome {
    /// seconds from sending to the first token, None if none came
    first: Option<f64>,
    total: f64,
    /// tokens received (the server's own count where it gives one)
    tokens: f64,
    /// each event's arrival and the tokens it carried
    arrivals: Vec<(Instant, f64)>,
}

/// The tallies of one level, shared by its clients.
#[derive(Default)]
struct Tally {
    ttfts: Vec<f64>,
    per_token: Vec<f64>,
    errors: usize,
    /// the first few errors' messages (a dead server fails thousands of times a second)
    first_errors: Vec<String>,
    generated: f64,
    in_window: f64,
    cancelled: usize,
}

/// Runs one level of `clients` closed-loop clients (phases in the module doc).
pub fn level(o: &LoadOptions, clients: usize) -> Result<LevelReport> {
    o.check(&[clients])?;
    let tally = Mutex::new(Tally::default());
    let done = AtomicUsize::new(0);
    let start = Instant::now();
    let stop_at = start + Duration::from_secs_f64(o.seconds);
    let ramp_end = start + Duration::from_secs_f64(o.stagger.min(o.seconds));
    let mut rss = Vec::new();
    std::thread::scope(|s| {
        // 1–2. the clients
        for i in 0..clients {
            let (tally, done) = (&tally, &done);
            s.spawn(move || {
                client(o, i, clients, (ramp_end, stop_at), tally);
                done.fetch_add(1, Ordering::Release);
            });
        }
        // 3. the server's memory while they run
        while let Some(pid) = o.pid {
            if done.load(Ordering::Acquire) == clients {
                break;
            }
            rss.extend(status_kib(&pid.to_string(), "VmRSS").map(|k| k as f64 / 1024.0));
            let until = Instant::now() + Duration::from_secs_f64(o.rss_every);
            while Instant::now() < until && done.load(Ordering::Acquire) < clients {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    // 4. the level's figures
    let t = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    let window = stop_at.duration_since(ramp_end).as_secs_f64().max(1e-9);
    Ok(LevelReport {
        clients,
        requests: t.ttfts.len(),
        tokens_per_s: t.in_window / window,
        generated: t.generated.round() as usize,
        wall_s: start.elapsed().as_secs_f64(),
        ttft_p50_ms: 1000.0 * percentile(&t.ttfts, 0.5),
        ttft_p99_ms: 1000.0 * percentile(&t.ttfts, 0.99),
        token_p50_ms: 1000.0 * percentile(&t.per_token, 0.5),
        token_p99_ms: 1000.0 * percentile(&t.per_token, 0.99),
        errors: t.errors,
        cancelled: t.cancelled,
        first_errors: t.first_errors,
        rss_mib_series: rss,
        peak_rss_mib: o
            .pid
            .and_then(|p| status_kib(&p.to_string(), "VmHWM"))
            .map(|k| k as f64 / 1024.0),
    })
}

/// Client i's loop: requests one after another until the level's end, each tallied.
fn client(
    o: &LoadOptions,
    i: usize,
    clients: usize,
    (ramp_end, stop_at): (Instant, Instant),
    tally: &Mutex<Tally>,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(i as u64);
    std::thread::sleep(Duration::from_secs_f64(
        i as f64 * o.stagger / clients as f64,
    ));
    let mut k = 0;
    while Instant::now() < stop_at {
        let sent = Instant::now();
        let prompt = format!("Client {i} request {k}: once upon a time");
        k += 1;
        let hang_up = (rng.random::<f64>() < o.disconnect)
            .then(|| rng.random_range(1..=o.tokens.saturating_sub(1).max(1)));
        let r = one_request(&o.addr, &body(o, &prompt), hang_up);
        let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                t.errors += 1;
                if t.first_errors.len() < 3 {
                    t.first_errors.push(e);
                }
                continue;
            }
        };
        t.generated += r.tokens;
        t.in_window += r
            .arrivals
            .iter()
            .filter(|(at, _)| (ramp_end..stop_at).contains(at))
            .map(|(_, n)| n)
            .sum::<f64>();
        if hang_up.is_some() {
            t.cancelled += 1;
            continue;
        }
        if let (Some(first), true) = (r.first, sent >= ramp_end) {
            t.ttfts.push(first);
            if r.tokens > 1.0 {
                t.per_token.push((r.total - first) / (r.tokens - 1.0));
            }
        }
    }
}

/// The request's JSON body.
fn body(o: &LoadOptions, prompt: &str) -> String {
    let mut b = serde_json::json!({
        "prompt": prompt,
        "max_tokens": o.tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    });
    if let Some(m) = &o.model {
        b["model"] = m.clone().into();
    }
    b.to_string()
}

/// Sends one streaming completion and reads its events; with `hang_up_after` = N, closes the
/// connection after N tokens. Errors are the message to count.
fn one_request(
    addr: &str,
    body: &str,
    hang_up_after: Option<usize>,
) -> std::result::Result<Outcome, String> {
    let t0 = Instant::now();
    let mut sock = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    sock.set_nodelay(true).ok();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes())
        .and_then(|_| sock.write_all(body.as_bytes()))
        .map_err(|e| format!("send: {e}"))?;
    let mut r = BufReader::new(sock.try_clone().map_err(|e| e.to_string())?);
    let chunked = read_head(&mut r)?;
    let (mut first, mut events, mut usage, mut arrivals) = (None, 0usize, None, Vec::new());
    let mut lines = SseLines::new(r, chunked);
    while let Some(line) = lines.next_line()? {
        let Some(data) = line.strip_prefix(b"data: ") else {
            continue;
        };
        if data.trim_ascii() == b"[DONE]" {
            break;
        }
        let chunk: serde_json::Value =
            serde_json::from_slice(data).map_err(|e| format!("event: {e}"))?;
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            usage = Some(n as f64);
        }
        if chunk["choices"].as_array().is_some_and(|c| !c.is_empty()) {
            // an event per token, unless the server holds back partial characters
            events += 1;
            let now = Instant::now();
            arrivals.push(now);
            first.get_or_insert(now.duration_since(t0).as_secs_f64());
            if hang_up_after.is_some_and(|n| events >= n) {
                sock.shutdown(std::net::Shutdown::Both).ok();
                let arrivals = arrivals.into_iter().map(|t| (t, 1.0)).collect();
                return Ok(Outcome {
                    first: None,
                    total: t0.elapsed().as_secs_f64(),
                    tokens: events as f64,
                    arrivals,
                });
            }
        }
    }
    // a server that sends several tokens in one event (llama-server, holding back bytes that
    // do not yet make a whole UTF-8 character) gives its own count: spread over the events
    let tokens = usage.unwrap_or(events as f64);
    let per = if events > 0 {
        tokens / events as f64
    } else {
        0.0
    };
    Ok(Outcome {
        first,
        total: t0.elapsed().as_secs_f64(),
        tokens,
        arrivals: arrivals.into_iter().map(|t| (t, per)).collect(),
    })
}

/// Reads the status line and headers; an error unless 200. Returns whether the body is chunked.
fn read_head(r: &mut impl BufRead) -> std::result::Result<bool, String> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| format!("read: {e}"))?;
    let status = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| format!("read: {e}"))? == 0 {
            return Err("connection closed in the response's head".into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            chunked |= k.eq_ignore_ascii_case("transfer-encoding")
                && v.trim().eq_ignore_ascii_case("chunked");
        }
    }
    if status != "200" {
        return Err(format!("status {status}"));
    }
    Ok(chunked)
}

/// The lines of a response body, de-chunked where it is chunked.
struct SseLines<R> {
    r: R,
    chunked: bool,
    /// bytes read but not yet handed out as lines
    buf: Vec<u8>,
    /// bytes of the current chunk still to read
    left: usize,
    eof: bool,
}

impl<R: BufRead> SseLines<R> {
    fn new(r: R, chunked: bool) -> Self {
        SseLines {
            r,
            chunked,
            buf: Vec::new(),
            left: 0,
            eof: false,
        }
    }

    /// The next line without its line end, None at the body's end.
    fn next_line(&mut self) -> std::result::Result<Option<Vec<u8>>, String> {
        loop {
            if let Some(at) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=at).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Ok(Some(line));
            }
            if self.eof {
                return Ok((!self.buf.is_empty()).then(|| std::mem::take(&mut self.buf)));
            }
            self.fill().map_err(|e| format!("read: {e}"))?;
        }
    }

    /// Appends the next bytes of the body to `buf` (or marks its end).
    fn fill(&mut self) -> std::io::Result<()> {
        if self.chunked && self.left == 0 {
            // a chunk's size line, in hex (after the previous chunk's CRLF)
            let mut size = String::new();
            while size.trim().is_empty() {
                size.clear();
                if self.r.read_line(&mut size)? == 0 {
                    self.eof = true;
                    return Ok(());
                }
            }
            let hex = size.trim().split(';').next().unwrap_or("");
            self.left = usize::from_str_radix(hex, 16).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size")
            })?;
            if self.left == 0 {
                self.eof = true;
                return Ok(());
            }
        }
        let mut tmp = [0u8; 4096];
        let want = if self.chunked {
            self.left.min(tmp.len())
        } else {
            tmp.len()
        };
        let n = self.r.read(&mut tmp[..want])?;
        if n == 0 {
            self.eof = true;
        }
        self.left = self.left.saturating_sub(n);
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(())
    }
}

/// The `q` quantile of `xs` (the nearest rank, as `bench/serve_load.py` takes it); NaN if empty.
fn percentile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[((q * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_host_and_port_or_a_one_line_refusal() {
        assert_eq!(
            parse_url("http://127.0.0.1:8080").unwrap(),
            "127.0.0.1:8080"
        );
        assert_eq!(parse_url("http://localhost:9/").unwrap(), "localhost:9");
        assert_eq!(parse_url("http://example").unwrap(), "example:80");
        for bad in [
            "https://x:1",
            "127.0.0.1:8080",
            "http://x:port",
            "http://x:1/v1",
            "http://",
        ] {
            let e = parse_url(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("http://HOST"), "{e}");
        }
    }

    /// A chunked body whose chunks cut events mid-line, and an unchunked one, give the same
    /// lines.
    #[test]
    fn chunked_bodies_give_the_lines_that_were_sent() {
        let text = "data: {\"a\":1}\n\ndata: {\"b\":22}\r\n\r\ndata: [DONE]\n\n";
        let mut chunked = Vec::new();
        for piece in [&text[..5], &text[5..19], &text[19..20], &text[20..]] {
            chunked.extend(format!("{:x}\r\n{piece}\r\n", piece.len()).bytes());
        }
        chunked.extend(b"0\r\n\r\n");
        let read = |bytes: &[u8], is_chunked: bool| {
            let mut l = SseLines::new(BufReader::new(bytes), is_chunked);
            let mut out = Vec::new();
            while let Some(line) = l.next_line().unwrap() {
                out.push(String::from_utf8(line).unwrap());
            }
            out
        };
        let want = [
            "data: {\"a\":1}",
            "",
            "data: {\"b\":22}",
            "",
            "data: [DONE]",
            "",
        ];
        assert_eq!(read(&chunked, true), want);
        assert_eq!(read(text.as_bytes(), false), want);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 0.5), 51.0);
        assert_eq!(percentile(&xs, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
