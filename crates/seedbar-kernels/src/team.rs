//! A team of threads that share a step's parallel loops: [`Team::for_each`] runs `task(i)`
//! for every `i` of a loop on the calling thread and the team's helpers, which claim indices
//! from one atomic counter.
//!
//! A decoding step of a small model is about 150 short loops (the matmuls and attention of
//! each layer), a few microseconds apart. A general pool puts its idle threads to sleep
//! within microseconds and wakes them with a system call per loop; measured on 2 cores,
//! that scheduling took a fifth of a decode step. The helpers here wait between loops for
//! [`SPIN`] instead, spinning and yielding their core to any other thread with work (as
//! llama.cpp's thread pool polls), and only then sleep, so inside a step no loop waits for a
//! wake-up. Which thread runs which index never changes a result: every
//! task writes its own outputs.
//!
//! One caller drives the team at a time. A second caller, or a task that calls `for_each`
//! itself, runs its loop alone on its own thread (the same results, no waiting).

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// How long an idle helper waits for the next loop (spinning, then yielding its core at each
/// turn) before it sleeps: longer than the gaps inside a step and between the steps of a busy
/// scheduler.
pub const SPIN: Duration = Duration::from_millis(2);

/// The most indices one published loop holds (`for_each` publishes longer loops in parts).
const MAX_TASKS: usize = u16::MAX as usize;

/// Threads sharing loops: the caller of [`for_each`](Team::for_each) and `threads - 1`
/// helpers. Dropping the team stops the helpers.
pub struct Team {
    shared: Arc<Shared>,
    /// Held by the thread driving the team.
    driver: Mutex<()>,
    helpers: Vec<thread::JoinHandle<()>>,
}

/// The loop a caller publishes, on the caller's stack while it runs.
struct Job<'a> {
    task: &'a (dyn Fn(usize) + Sync),
}

struct Shared {
    /// `epoch << 32 | tasks << 16 | next`: the published loop, its length and the next
    /// index to claim. A claim is a compare-and-swap of the whole word, so a helper late from
    /// an earlier loop can never claim an index of a later one.
    word: AtomicU64,
    /// The current loop (valid while one of its indices is claimed and not yet finished).
    job: AtomicPtr<Job<'static>>,
    /// Indices of the current loop finished (run or panicked).
    finished: AtomicUsize,
    panicked: AtomicBool,
    /// Helpers asleep, and the lock and signal they sleep on.
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
}

impl Team {
    /// The process's team: one thread per processor this process may run on.
    pub fn shared() -> &'static Team {
        static TEAM: OnceLock<Team> = OnceLock::new();
        TEAM.get_or_init(|| Team::new(thread::available_parallelism().map_or(1, |n| n.get())))
    }

    /// A team of `threads` threads in all (the caller counts as one).
    pub fn new(threads: usize) -> Team {
        let shared = Arc::new(Shared {
            word: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            finished: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let helpers = (1..threads.max(1))
            .map(|i| {
                let shared = shared.clone();
                thread::Builder::new()
                    .name(format!("seedbar-kernels-{i}"))
                    .spawn(move || shared.help())
                    .expect("spawn a kernel thread")
            })
            .collect();
        Team {
            shared,
            driver: Mutex::new(()),
            helpers,
        }
    }

    /// Threads in the team, the caller included.
    pub fn threads(&self) -> usize {
        self.helpers.len() + 1
    }

    /// Run `task(i)` for every `i` in `0..tasks`, on this thread and the team's helpers;
    /// returns when every one has run. A panic in a task is raised here once all have ended.
    pub fn for_each(&self, tasks: usize, task: impl Fn(usize) + Sync) {
        let driving = match self.driver.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if driving.is_none() || self.helpers.is_empty() || tasks < 2 {
            (0..tasks).for_each(task);
            return;
        }
        for start in (0..tasks).step_by(MAX_TASKS) {
            let len = (tasks - start).min(MAX_TASKS);
            let part = |i: usize| task(start + i);
            self.shared.run(len, &part);
        }
    }

    /// `f(i)` for every `i` in `0..tasks`, run as [`for_each`](Self::for_each), in order.
    pub fn map<T: Send>(&self, tasks: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
        let slots: Vec<Mutex<Option<T>>> = (0..tasks).map(|_| Mutex::new(None)).collect();
        self.for_each(tasks, |i| {
            *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(f(i));
        });
        slots
            .into_iter()
            .map(|s| {
                s.into_inner()
                    .unwrap_or_else(|p| p.into_inner())
                    .expect("every task ran")
            })
            .collect()
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        drop(self.shared.lock.lock());
        self.shared.wake.notify_all();
        for helper in self.helpers.drain(..) {
            let _ = helper.join();
        }
    }
}

impl Shared {
    /// Publish a loop of `tasks` (2..=MAX_TASKS) indices, take part, wait for its end.
    fn run(&self, tasks: usize, task: &(dyn Fn(usize) + Sync)) {
        let job = Job { task };
        // SAFETY: the pointer is read only by a thread holding an unfinished index of this
        // loop, and this function returns only once every index has finished.
        let erased = (&job as *const Job<'_>).cast::<Job<'static>>() as *mut Job<'static>;
        self.job.store(erased, SeqCst);
        self.finished.store(0, SeqCst);
        self.panicked.store(false, SeqCst);
        let epoch = (self.word.load(SeqCst) >> 32).wrapping_add(1) & u32::MAX as u64;
        let word = epoch << 32 | (tasks as u64) << 16;
        self.word.store(word, SeqCst);
        if self.sleeping.load(SeqCst) > 0 {
            drop(self.lock.lock());
            self.wake.notify_all();
        }
        self.claim_all(epoch);
        let mut backoff = Backoff::default();
        while self.finished.load(Acquire) < tasks {
            backoff.wait();
        }
        if self.panicked.load(SeqCst) {
            panic!("a kernel task panicked");
        }
    }

    /// Claim and run indices of loop `epoch` until none is left.
    fn claim_all(&self, epoch: u64) {
        let mut word = self.word.load(Acquire);
        loop {
            let (tasks, next) = ((word >> 16) & 0xffff, word & 0xffff);
            if word >> 32 != epoch || next >= tasks {
                return;
            }
            match self
                .word
                .compare_exchange_weak(word, word + 1, AcqRel, Acquire)
            {
                Ok(_) => {
                    // SAFETY: index `next` is claimed and unfinished, so the loop's caller
                    // is still waiting in `run` with `job` on its stack.
                    let job = unsafe { &*self.job.load(Acquire) };
                    let ran = panic::catch_unwind(AssertUnwindSafe(|| (job.task)(next as usize)));
                    if ran.is_err() {
                        self.panicked.store(true, SeqCst);
                    }
                    self.finished.fetch_add(1, Release);
                    word = self.word.load(Acquire);
                }
                Err(now) => word = now,
            }
        }
    }

    /// A helper's life: wait for a loop (spinning, then asleep), take part, repeat.
    fn help(&self) {
        let mut seen = self.word.load(SeqCst) >> 32;
        loop {
            let since = Instant::now();
            let mut backoff = Backoff::default();
            let epoch = loop {
                let epoch = self.word.load(Acquire) >> 32;
                if epoch != seen {
                    break epoch;
                }
                if self.stop.load(Relaxed) {
                    return;
                }
                if backoff.wait() && since.elapsed() > SPIN {
                    self.sleep_until_after(seen);
                }
            };
            seen = epoch;
            self.claim_all(epoch);
        }
    }

    /// Sleep until the published loop is a later one than `seen` (or the team stops).
    fn sleep_until_after(&self, seen: u64) {
        let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.sleeping.fetch_add(1, SeqCst);
        while self.word.load(SeqCst) >> 32 == seen && !self.stop.load(SeqCst) {
            guard = self.wake.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
        self.sleeping.fetch_sub(1, SeqCst);
    }
}

/// A wait that spins for [`Backoff::SPIN`], then yields its core at each turn: a thread waiting
/// on the team then gives way to any other thread of the process that has work (a helper
/// preempted in the middle of a task, the scheduler's sampling threads), and still sees the
/// awaited change within microseconds when the core is free.
#[derive(Default)]
struct Backoff {
    turns: u32,
    since: Option<Instant>,
}

impl Backoff {
    /// How long a wait spins before it yields: the gaps between a step's loops are shorter.
    const SPIN: Duration = Duration::from_micros(50);

    /// One turn of waiting; true once the waiter yields.
    fn wait(&mut self) -> bool {
        self.turns += 1;
        let since = *self.since.get_or_insert_with(Instant::now);
        if !self.turns.is_multiple_of(64) || since.elapsed() < Self::SPIN {
            std::hint::spin_loop();
            return false;
        }
        thread::yield_now();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_on_any_team() {
        for threads in [1, 2, 3] {
            let team = Team::new(threads);
            for tasks in [0, 1, 2, 7, 100] {
                let runs: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                team.for_each(tasks, |i| {
                    runs[i].fetch_add(1, SeqCst);
                });
                assert!(
                    runs.iter().all(|r| r.load(SeqCst) == 1),
                    "{threads} {tasks}"
                );
            }
            assert_eq!(team.map(5, |i| i * i), vec![0, 1, 4, 9, 16]);
        }
    }

    #[test]
    fn helpers_wake_after_sleeping_and_loops_nest() {
        let team = Team::new(2);
        thread::sleep(SPIN * 3);
        let sums = team.map(4, |i| team.map(3, |j| i * 3 + j).iter().sum::<usize>());
        assert_eq!(sums, vec![3, 12, 21, 30]);
    }

    #[test]
    fn a_panicking_task_panics_the_caller_and_the_team_goes_on() {
        let team = Team::new(2);
        let caught = panic::catch_unwind(AssertUnwindSafe(|| {
            team.for_each(8, |i| assert!(i != 5, "task 5"));
        }));
        assert!(caught.is_err());
        assert_eq!(team.map(3, |i| i + 1), vec![1, 2, 3]);
    }
}
