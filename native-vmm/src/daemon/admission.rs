//! Which executions run now and which wait (PROTOCOL.md, `execute`): at most `max_running` run at
//! once over all connections; the rest wait in one line, and a freed slot goes straight to the
//! oldest waiter. At most `max_queued_per_template` of one template and `max_queued_per_key` of one key
//! (the request's `key_id`) wait: one more is refused at once with the bound it met, which the
//! server answers `busy`. (The line's overall bound is the server's, `max_queued`.)

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    pub max_running: usize,
    pub max_queued_per_template: usize,
    pub max_queued_per_key: usize,
}

/// The line an execution could not join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullLine {
    Template,
    Key,
}

/// Where an execution waits: per template and per key; None is not counted in those lines (a
/// session's cell). Borrowed: an execution that runs at once copies neither name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Line<'a> {
    pub template: Option<&'a str>,
    pub key: Option<&'a str>,
}

/// A waiting execution's ticket and the lines it is counted in.
struct Waiter {
    ticket: u64,
    template: Option<String>,
    key: Option<String>,
}

pub struct RunQueue {
    limits: RunLimits,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    running: usize,
    /// The executions waiting, oldest first.
    waiting: VecDeque<Waiter>,
    /// Waiters a freed slot was handed to, which have not taken it yet.
    granted: HashSet<u64>,
    next_ticket: u64,
    queued_by_template: HashMap<String, usize>,
    queued_by_key: HashMap<String, usize>,
}

impl State {
    /// Hands the free slots to the oldest waiters, there and then: the counts never hold a
    /// waiter that has its slot but was not scheduled yet.
    fn grant(&mut self, max_running: usize) {
        while self.running < max_running {
            let Some(waiter) = self.waiting.pop_front() else {
                break;
            };
            self.uncount(&waiter);
            self.running += 1;
            self.granted.insert(waiter.ticket);
        }
    }

    fn uncount(&mut self, waiter: &Waiter) {
        count_down(&mut self.queued_by_template, waiter.template.as_deref());
        count_down(&mut self.queued_by_key, waiter.key.as_deref());
    }
}

fn count_down(counts: &mut HashMap<String, usize>, name: Option<&str>) {
    let Some(name) = name else { return };
    if let Some(n) = counts.get_mut(name) {
        *n -= 1;
        if *n == 0 {
            counts.remove(name);
        }
    }
}

fn queued(counts: &HashMap<String, usize>, name: Option<&str>) -> usize {
    name.and_then(|n| counts.get(n)).copied().unwrap_or(0)
}

/// What the line holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Depths {
    pub running: usize,
    pub queued: usize,
    /// Waiting executions per template, templates with none left out, sorted by name.
    pub queued_by_template: Vec<(String, usize)>,
}

impl RunQueue {
    pub fn new(limits: RunLimits) -> Arc<RunQueue> {
        Arc::new(RunQueue {
            limits,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The counts stay consistent even if a holder panicked: recover them.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A running slot now when one is free and nobody waits, else a place in `line`; refused
    /// when that line is full.
    pub fn enter(self: &Arc<RunQueue>, line: Line<'_>) -> Result<Turn, FullLine> {
        let mut state = self.lock();
        if state.running < self.limits.max_running && state.waiting.is_empty() {
            state.running += 1;
            return Ok(Turn {
                queue: self.clone(),
                place: Place::Running,
            });
        }
        if line.template.is_some()
            && queued(&state.queued_by_template, line.template)
                >= self.limits.max_queued_per_template
        {
            return Err(FullLine::Template);
        }
        if line.key.is_some()
            && queued(&state.queued_by_key, line.key) >= self.limits.max_queued_per_key
        {
            return Err(FullLine::Key);
        }
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let state = &mut *state;
        for (counts, name) in [
            (&mut state.queued_by_template, line.template),
            (&mut state.queued_by_key, line.key),
        ] {
            if let Some(name) = name {
                *counts.entry(name.to_owned()).or_insert(0) += 1;
            }
        }
        state.waiting.push_back(Waiter {
            ticket,
            template: line.template.map(str::to_owned),
            key: line.key.map(str::to_owned),
        });
        Ok(Turn {
            queue: self.clone(),
            place: Place::Waiting(ticket),
        })
    }

    pub fn depths(&self) -> Depths {
        let state = self.lock();
        let mut queued_by_template: Vec<(String, usize)> = state
            .queued_by_template
            .iter()
            .map(|(name, n)| (name.clone(), *n))
            .collect();
        queued_by_template.sort();
        Depths {
            running: state.running,
            queued: state.waiting.len(),
            queued_by_template,
        }
    }

    /// A slot comes back: to the oldest waiter, if any.
    fn give_back(&self, state: &mut State) {
        state.running -= 1;
        state.grant(self.limits.max_running);
        self.changed.notify_all();
    }
}

enum Place {
    Running,
    Waiting(u64),
    /// Handed on to its `Running` slot.
    Done,
}

/// An execution's place: a running slot, or its place in line. Dropped before its turn, it
/// leaves the line (or gives the slot back).
pub struct Turn {
    queue: Arc<RunQueue>,
    place: Place,
}

impl Turn {
    /// Waits until a freed slot is handed to this execution (the oldest waiting gets it).
    pub fn wait(mut self) -> Running {
        if let Place::Waiting(ticket) = self.place {
            let queue = &self.queue;
            let mut state = queue.lock();
            while !state.granted.remove(&ticket) {
                state = queue.changed.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        }
        self.place = Place::Done;
        Running(self.queue.clone())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let queue = &self.queue;
        match std::mem::replace(&mut self.place, Place::Done) {
            Place::Running => queue.give_back(&mut queue.lock()),
            Place::Waiting(ticket) => {
                let mut state = queue.lock();
                if state.granted.remove(&ticket) {
                    // Its slot was handed over already: on to the next.
                    queue.give_back(&mut state);
                } else if let Some(at) = state.waiting.iter().position(|w| w.ticket == ticket) {
                    if let Some(waiter) = state.waiting.remove(at) {
                        state.uncount(&waiter);
                    }
                }
            }
            Place::Done => {}
        }
    }
}

/// A running slot, given back when dropped.
pub struct Running(Arc<RunQueue>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.give_back(&mut self.0.lock());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    const LIMITS: RunLimits = RunLimits {
        max_running: 1,
        max_queued_per_template: 2,
        max_queued_per_key: 1,
    };

    fn line<'a>(template: &'a str, key: Option<&'a str>) -> Line<'a> {
        Line {
            template: Some(template),
            key,
        }
    }

    #[test]
    fn past_a_templates_or_a_keys_line_an_execution_is_refused_and_the_others_still_wait() {
        let queue = RunQueue::new(LIMITS);
        let running = queue.enter(line("python", Some("a"))).unwrap().wait();
        let _a = queue.enter(line("python", Some("a"))).unwrap();
        // Key a has one waiting: its next is refused, whatever its template.
        assert_eq!(
            queue.enter(line("node", Some("a"))).err(),
            Some(FullLine::Key)
        );
        let _b = queue.enter(line("python", Some("b"))).unwrap();
        // python has two waiting: refused, whoever asks; another template still waits.
        assert_eq!(
            queue.enter(line("python", Some("c"))).err(),
            Some(FullLine::Template)
        );
        let _node = queue.enter(line("node", None)).unwrap();
        // A line that counts neither (a session's cell) still waits.
        let _cell = queue.enter(Line::default()).unwrap();
        assert_eq!(
            queue.depths(),
            Depths {
                running: 1,
                queued: 4,
                queued_by_template: vec![("node".into(), 1), ("python".into(), 2)],
            }
        );
        // The freed slot goes to the oldest waiter there and then, before it is even scheduled:
        // its lines no longer count it, so key a may wait again.
        drop(running);
        assert_eq!(
            queue.depths(),
            Depths {
                running: 1,
                queued: 3,
                queued_by_template: vec![("node".into(), 1), ("python".into(), 1)],
            }
        );
        let _a_again = queue.enter(line("node", Some("a"))).unwrap();
        // The oldest, dropped with its slot handed over, passes it on to the next.
        drop(_a);
        assert_eq!(queue.depths().queued, 3);
    }

    #[test]
    fn a_freed_slot_goes_to_the_oldest_waiter_and_one_that_leaves_frees_its_place() {
        let queue = RunQueue::new(RunLimits {
            max_queued_per_template: 10,
            max_queued_per_key: 10,
            ..LIMITS
        });
        let running = queue.enter(line("python", None)).unwrap().wait();
        let (order, ran) = mpsc::channel();
        let mut waiters = Vec::new();
        for n in 0..4 {
            let turn = queue.enter(line("python", None)).unwrap();
            if n == 2 {
                // Leaves the line before its turn: it must not hold up the ones behind it.
                drop(turn);
                continue;
            }
            let order = order.clone();
            waiters.push(thread::spawn(move || {
                let slot = turn.wait();
                order.send(n).unwrap();
                thread::sleep(Duration::from_millis(5));
                drop(slot);
            }));
        }
        // The waiters block until the slot is given back.
        assert!(ran.recv_timeout(Duration::from_millis(50)).is_err());
        assert_eq!(queue.depths().queued, 3);
        drop(running);
        let served: Vec<i32> = (0..3)
            .map(|_| ran.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        assert_eq!(served, [0, 1, 3]);
        for waiter in waiters {
            waiter.join().unwrap();
        }
        assert_eq!(
            queue.depths(),
            Depths {
                running: 0,
                queued: 0,
                queued_by_template: vec![],
            }
        );
        // With a slot free and nobody waiting, an execution runs at once.
        let _now = queue.enter(line("python", Some("a"))).unwrap().wait();
        assert_eq!(queue.depths().running, 1);
    }
}
