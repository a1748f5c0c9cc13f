//! Running a whole step on the rayon pool, with the other workers kept awake meanwhile.
//!
//! A step forks a few hundred parallel ops. Between two of them an idle rayon worker yields
//! for a few tens of µs and then sleeps, and waking it for the next op costs a futex call and,
//! on a virtual machine, an interrupt through the hypervisor: at the `bench` preset that was
//! about a tenth of a bf16 training step. While a step runs, the other workers instead poll
//! for work.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Runs `f` on a rayon worker thread. Called from outside the pool, every parallel op would
/// be injected into the pool separately (and rayon's injector allocates as it goes); running a
/// whole step inside the pool makes its parallel ops plain worker-local forks.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        f()
    } else {
        on_pool_quiet(|| {
            let _awake = KeepAwake::start();
            f()
        })
    }
}

/// Runs `f` on a rayon worker as `on_pool` does, but leaves the other workers to rayon's own
/// idling (a short spin, then sleep until work comes): for a loop that shares the cores with
/// other busy threads, such as the server's HTTP side and its clients, which workers polling
/// between steps would crowd out (`serve --parallel 16` at q8_0 with workers polling all
/// along: 2–10% fewer tokens a second and a later p99 first token, 5 rounds of 5).
pub fn on_pool_quiet<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        f()
    } else {
        rayon::scope(|_| f())
    }
}

/// Whether some `on_pool` call keeps the workers awake now: one at a time, so that two
/// callers' polling loops can never each wait for the other's to end.
static SESSION: AtomicBool = AtomicBool::new(false);
/// Counts the sessions ended: a poller runs until it moves past the value it started with.
static ENDED: AtomicU64 = AtomicU64::new(0);

/// A poller stops after this long without finding work (a long serial stretch), so that an
/// unforeseen wait never spins a core for long.
const IDLE_LIMIT: Duration = Duration::from_millis(20);

/// The other workers poll for work until this is dropped.
struct KeepAwake {
    owner: bool,
}

impl KeepAwake {
    fn start() -> KeepAwake {
        let Some(runner) = rayon::current_thread_index() else {
            return KeepAwake { owner: false };
        };
        if rayon::current_num_threads() < 2 || !claim() {
            return KeepAwake { owner: false };
        }
        let session = ENDED.load(Ordering::Acquire);
        // Queued before `f` forks anything: each worker finds its copy before any of f's work.
        rayon::spawn_broadcast(move |_| {
            if rayon::current_thread_index() != Some(runner) {
                poll(session);
            }
        });
        KeepAwake { owner: true }
    }
}

impl Drop for KeepAwake {
    fn drop(&mut self) {
        if self.owner {
            ENDED.fetch_add(1, Ordering::AcqRel);
            SESSION.store(false, Ordering::Release);
        }
    }
}

fn claim() -> bool {
    SESSION
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// Runs whatever work the pool has until session `session` ends, spinning in between.
fn poll(session: u64) {
    let mut last_work = Instant::now();
    let mut spins = 0u32;
    while ENDED.load(Ordering::Acquire) == session {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            spins = 0;
            last_work = Instant::now();
            continue;
        }
        std::hint::spin_loop();
        spins += 1;
        // The clock only now and then: a poll without work takes well under a µs.
        if spins.is_multiple_of(1024) && last_work.elapsed() > IDLE_LIMIT {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Nested parallel work: joins whose halves other workers steal and wait on.
    fn nested_sum(i: u64) -> u64 {
        (0..8u64)
            .into_par_iter()
            .map(|j| {
                (0..2_000u64)
                    .into_par_iter()
                    .map(|x| x * i + j)
                    .sum::<u64>()
            })
            .sum()
    }

    /// `on_pool_quiet` runs its closure on a worker, called from outside the pool or inside
    /// it, with the answer `on_pool` gives.
    #[test]
    fn quiet_runs_on_a_worker() {
        assert!(rayon::current_thread_index().is_none());
        let (worker, inner) = on_pool_quiet(|| {
            let inner = on_pool_quiet(rayon::current_thread_index);
            (rayon::current_thread_index(), inner)
        });
        assert!(worker.is_some());
        assert_eq!(inner, worker);
        assert_eq!(on_pool_quiet(|| nested_sum(3)), on_pool(|| nested_sum(3)));
    }

    /// Steps on the pool from several OS threads at once (as the test harness does) all finish
    /// with the serial answer, also when a serial stretch outlasts the pollers' idle limit.
    #[test]
    fn concurrent_callers_all_finish() {
        let handles: Vec<_> = (0..4u64)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut sums: Vec<u64> = (0..50).map(|_| on_pool(|| nested_sum(i))).collect();
                    sums.push(on_pool(|| {
                        std::thread::sleep(IDLE_LIMIT + Duration::from_millis(10));
                        nested_sum(i)
                    }));
                    sums
                })
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            let want: u64 = (0..8u64)
                .map(|j| (0..2_000u64).map(|x| x * i as u64 + j).sum::<u64>())
                .sum();
            assert!(h.join().unwrap().iter().all(|&s| s == want));
        }
    }
}
