//! Embed `difftx serve` in a program of your own: start the OpenAI-compatible server on a
//! port the system picks, send it one completion request, and stop it.
//!
//! ```text
//! cargo run --release --example embed_server -- [MODEL_DIR]
//! ```
//!
//! Without a model it serves an untrained tiny diff_v1 one. The server stops on a
//! `Shutdown` handle's `stop` (as `difftx serve` does on SIGTERM or SIGINT).

use difftx::prelude::*;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One HTTP/1.1 request on a fresh connection: the status code and the body.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let status = answer.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_string()))
}

fn run() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut _temp = None;
    let dir = match std::env::args().nth(1) {
        Some(d) => PathBuf::from(d),
        None => {
            let t = tempfile::tempdir()?;
            Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0)?
                .save(t.path())?;
            let dir = t.path().to_path_buf();
            _temp = Some(t);
            dir
        }
    };
    // Fail here, in one line, rather than on the server's loading thread.
    difftx::interop::load_config(&dir)?;
    let opts = ServeOptions {
        host: "127.0.0.1".into(),
        port: 0,
        api_key: None,
        parallel: 4,
        max_queue: 16,
        chunk: 64,
        max_body_bytes: 1 << 20,
        prefix_cache: 0,
        name: "tiny".into(),
        grace: Duration::from_secs(1),
        speculate: Default::default(),
    };
    let load: difftx::serve::Loader = Box::new(move || {
        let (model, _tok) = open_model(&dir).map_err(|e| e.to_string())?;
        Ok((model, dir))
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let shutdown = Shutdown::new();
    let handle = shutdown.clone();
    let server = std::thread::spawn(move || {
        serve_until(opts, load, move |addr| tx.send(addr).unwrap(), handle)
    });
    let addr = rx.recv().map_err(|_| "the server did not start")?;
    println!("listening on http://{addr}");

    // /health answers 503 while the model loads, 200 once it is ready
    while request(addr, "GET", "/health", "")?.0 == 503 {
        std::thread::sleep(Duration::from_millis(20));
    }
    let body = r#"{"model": "tiny", "prompt": "Once", "max_tokens": 8, "temperature": 0}"#;
    let (status, answer) = request(addr, "POST", "/v1/completions", body)?;
    println!("POST /v1/completions: {status}");
    println!("{answer}");

    shutdown.stop();
    server.join().map_err(|_| "the server thread panicked")??;
    println!("server stopped");
    Ok(())
}
