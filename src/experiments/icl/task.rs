//! The in-context classification task (see the module above): classes, episodes, the fixed
//! test set and the reference reader that knows the classes. Pure data, no model.

use crate::error::{Error, Result};
use crate::experiments::common::argmax;
use crate::kernels::cross_entropy::IGNORE;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The input alphabet.
pub const ALPHABET: &[u8; 16] = b"abcdefghijklmnop";
/// The label bytes an episode draws its K labels from.
pub const LABELS: &[u8; 10] = b"0123456789";
/// Salt of the permutations of the test set.
const ORDER_STREAM: u64 = 0x1c1_0000_0bde_0002;

/// One classified input.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub class: usize,
    pub input: Vec<u8>,
}

/// How an episode maps the K classes to labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relabel {
    /// K distinct digits in a random order: only the demonstrations of a class tell its label
    Random,
    /// class c gets digit (c + r) mod 10 with r random: any one demonstration tells them all
    Rotation,
}

/// The classification task: K classes, each a set of characteristic letters, inputs of a fixed
/// length with noise ε.
#[derive(Clone, Debug, PartialEq)]
pub struct IclTask {
    pub classes: usize,
    pub input_len: usize,
    pub noise: f64,
    /// the characteristic letters of each class, sorted
    pub letters: Vec<Vec<u8>>,
}

/// One prompt: T + 1 byte tokens; the model reads `tokens[..T]`, and the query's label is the
/// last token.
#[derive(Clone, Debug, PartialEq)]
pub struct IclEpisode {
    pub tokens: Vec<u32>,
    /// the label byte of each class in this episode
    pub labels: Vec<u8>,
    /// the class of each item, the query last
    pub classes: Vec<usize>,
    /// where each item's label sits in `tokens`, the query's last
    pub label_pos: Vec<usize>,
}

impl IclEpisode {
    /// Demonstrations before the query.
    pub fn shots(&self) -> usize {
        self.classes.len() - 1
    }

    /// Input tokens T.
    pub fn len(&self) -> usize {
        self.tokens.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The query's correct label.
    pub fn answer(&self) -> u8 {
        self.labels[*self.classes.last().expect("an episode has a query")]
    }

    /// Targets on every item's label only: `tokens[1..]` with every other position `IGNORE`.
    pub fn label_targets(&self) -> Vec<u32> {
        let mut y = vec![IGNORE; self.len()];
        for &p in &self.label_pos {
            y[p - 1] = self.tokens[p];
        }
        y
    }
}

impl IclTask {
    /// K classes of `letters_per_class` distinct letters each (no two classes with the same
    /// set), inputs of `input_len` letters with noise ε; everything from `seed`.
    pub fn synthetic(
        classes: usize,
        letters_per_class: usize,
        input_len: usize,
        noise: f64,
        seed: u64,
    ) -> Result<Self> {
        if classes < 2 || classes > LABELS.len() {
            return Err(Error::Invalid(format!(
                "classes ({classes}) must be between 2 and {}",
                LABELS.len()
            )));
        }
        if letters_per_class == 0 || letters_per_class >= ALPHABET.len() {
            return Err(Error::Invalid(format!(
                "letters_per_class ({letters_per_class}) must be between 1 and {}",
                ALPHABET.len() - 1
            )));
        }
        if input_len == 0 {
            return Err(Error::Invalid("input_len must be at least 1".into()));
        }
        if !(0.0..=1.0).contains(&noise) {
            return Err(Error::Invalid(format!("noise {noise} is outside [0, 1]")));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut letters: Vec<Vec<u8>> = Vec::with_capacity(classes);
        for _ in 0..10_000 {
            if letters.len() == classes {
                break;
            }
            let mut pool = ALPHABET.to_vec();
            for i in 0..letters_per_class {
                let j = rng.random_range(i..pool.len());
                pool.swap(i, j);
            }
            let mut set = pool[..letters_per_class].to_vec();
            set.sort_unstable();
            if !letters.contains(&set) {
                letters.push(set);
            }
        }
        if letters.len() < classes {
            return Err(Error::Invalid(format!(
                "cannot draw {classes} distinct sets of {letters_per_class} letters"
            )));
        }
        Ok(IclTask {
            classes,
            input_len,
            noise,
            letters,
        })
    }

    /// Bytes of one item: the input, then the label.
    pub fn item_len(&self) -> usize {
        self.input_len + 1
    }

    /// Input tokens T of a prompt with `shots` demonstrations (the model reads the query's
    /// input, not its label).
    pub fn prompt_len(&self, shots: usize) -> usize {
        shots * self.item_len() + self.input_len
    }

    /// The most demonstrations a prompt of at most `context` input tokens holds.
    pub fn max_shots(&self, context: usize) -> usize {
        context.saturating_sub(self.input_len) / self.item_len()
    }

    /// An input of `class`.
    pub fn item(&self, rng: &mut ChaCha8Rng, class: usize) -> Item {
        let own = &self.letters[class];
        let input = (0..self.input_len)
            .map(|_| {
                if rng.random::<f64>() < self.noise {
                    ALPHABET[rng.random_range(0..ALPHABET.len())]
                } else {
                    own[rng.random_range(0..own.len())]
                }
            })
            .collect();
        Item { class, input }
    }

    /// An item of a uniformly drawn class.
    pub fn any_item(&self, rng: &mut ChaCha8Rng) -> Item {
        let c = rng.random_range(0..self.classes);
        self.item(rng, c)
    }

    /// A label per class, drawn as `how` says.
    pub fn labels(&self, rng: &mut ChaCha8Rng, how: Relabel) -> Vec<u8> {
        match how {
            Relabel::Random => {
                let mut pool = LABELS.to_vec();
                for i in 0..self.classes {
                    let j = rng.random_range(i..pool.len());
                    pool.swap(i, j);
                }
                pool.truncate(self.classes);
                pool
            }
            Relabel::Rotation => {
                let r = rng.random_range(0..LABELS.len());
                (0..self.classes)
                    .map(|c| LABELS[(c + r) % LABELS.len()])
                    .collect()
            }
        }
    }

    /// The prompt of `demos` (in this order) then `query`, labelled by `labels`.
    pub fn render(&self, labels: &[u8], demos: &[&Item], query: &Item) -> IclEpisode {
        let mut bytes = Vec::with_capacity((demos.len() + 1) * self.item_len());
        let mut classes = Vec::with_capacity(demos.len() + 1);
        let mut label_pos = Vec::with_capacity(demos.len() + 1);
        for it in demos.iter().copied().chain(std::iter::once(query)) {
            bytes.extend_from_slice(&it.input);
            label_pos.push(bytes.len());
            bytes.push(labels[it.class]);
            classes.push(it.class);
        }
        IclEpisode {
            tokens: bytes.into_iter().map(u32::from).collect(),
            labels: labels.to_vec(),
            classes,
            label_pos,
        }
    }

    /// A fresh episode: a relabelling, `shots` demonstrations and a query, classes uniform.
    pub fn episode(&self, rng: &mut ChaCha8Rng, shots: usize, how: Relabel) -> IclEpisode {
        let labels = self.labels(rng, how);
        let items: Vec<Item> = (0..=shots).map(|_| self.any_item(rng)).collect();
        let demos: Vec<&Item> = items[..shots].iter().collect();
        self.render(&labels, &demos, &items[shots])
    }

    /// log p(input | class).
    pub fn log_likelihood(&self, input: &[u8], class: usize) -> f64 {
        let own = &self.letters[class];
        let uniform = self.noise / ALPHABET.len() as f64;
        let inside = (1.0 - self.noise) / own.len() as f64 + uniform;
        input
            .iter()
            .map(|b| if own.contains(b) { inside } else { uniform }.ln())
            .sum()
    }

    /// The most likely class of an input (the first at a tie).
    pub fn classify(&self, input: &[u8]) -> usize {
        let ll: Vec<f32> = (0..self.classes)
            .map(|c| self.log_likelihood(input, c) as f32)
            .collect();
        argmax(&ll)
    }

    /// The accuracy of `classify` on `n` seeded inputs: the best any reader can do on one
    /// query even when it knows the label of every class.
    pub fn bayes_accuracy(&self, n: usize, seed: u64) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let right = (0..n)
            .filter(|_| {
                let it = self.any_item(&mut rng);
                self.classify(&it.input) == it.class
            })
            .count();
        right as f64 / n.max(1) as f64
    }
}

/// One test episode: a label mapping, a query, `max_shots` demonstrations and P orders of
/// them.
#[derive(Clone, Debug, PartialEq)]
pub struct TestEpisode {
    pub labels: Vec<u8>,
    pub demos: Vec<Item>,
    pub query: Item,
    /// permutations of `0..demos.len()`
    pub orders: Vec<Vec<usize>>,
}

impl TestEpisode {
    /// The prompt with the first `shots` demonstrations in their drawn order.
    pub fn prompt(&self, task: &IclTask, shots: usize) -> IclEpisode {
        let d: Vec<&Item> = self.demos[..shots].iter().collect();
        task.render(&self.labels, &d, &self.query)
    }

    /// The prompt with all demonstrations in order `p`.
    pub fn permuted(&self, task: &IclTask, p: usize) -> IclEpisode {
        let d: Vec<&Item> = self.orders[p].iter().map(|&i| &self.demos[i]).collect();
        task.render(&self.labels, &d, &self.query)
    }
}

/// `n` test episodes of `max_shots` demonstrations with `orders` random permutations each,
/// all from `seed`: every model evaluated with one seed sees the same prompts.
pub fn test_set(
    task: &IclTask,
    n: usize,
    max_shots: usize,
    orders: usize,
    seed: u64,
) -> Vec<TestEpisode> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut perm_rng = ChaCha8Rng::seed_from_u64(seed ^ ORDER_STREAM);
    (0..n)
        .map(|_| {
            let labels = task.labels(&mut rng, Relabel::Random);
            let demos: Vec<Item> = (0..max_shots).map(|_| task.any_item(&mut rng)).collect();
            let query = task.any_item(&mut rng);
            let orders = (0..orders)
                .map(|_| {
                    let mut o: Vec<usize> = (0..max_shots).collect();
                    for i in (1..o.len()).rev() {
                        let j = perm_rng.random_range(0..=i);
                        o.swap(i, j);
                    }
                    o
                })
                .collect();
            TestEpisode {
                labels,
                demos,
                query,
                orders,
            }
        })
        .collect()
}

/// The reader that knows the classes, reading the prompt's bytes as the model does: the most
/// likely class of each demonstration's input and of the query's, then the label most of the
/// demonstrations of the query's class carry (the smallest label byte at a tie). When no
/// demonstration has that class, the smallest label no demonstration's class has claimed.
/// Its answer does not depend on the order of the demonstrations.
pub fn reference_predict(task: &IclTask, e: &IclEpisode) -> u8 {
    let w = task.item_len();
    let bytes: Vec<u8> = e.tokens.iter().map(|&t| t as u8).collect();
    let mut votes = vec![[0usize; 256]; task.classes];
    for i in 0..e.shots() {
        let item = &bytes[i * w..(i + 1) * w];
        let c = task.classify(&item[..task.input_len]);
        votes[c][item[task.input_len] as usize] += 1;
    }
    let q = e.shots() * w;
    let cq = task.classify(&bytes[q..q + task.input_len]);
    let mut sorted = e.labels.clone();
    sorted.sort_unstable();
    let best = sorted
        .iter()
        .copied()
        .max_by_key(|&l| (votes[cq][l as usize], std::cmp::Reverse(l)))
        .expect("an episode has labels");
    if votes[cq][best as usize] > 0 {
        return best;
    }
    sorted
        .iter()
        .copied()
        .find(|&l| votes.iter().all(|v| v[l as usize] == 0))
        .unwrap_or(sorted[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::icl::IclPlan;
    use crate::kernels::cross_entropy::counted;
    use std::collections::HashSet;

    fn task() -> IclTask {
        IclPlan::full().task().unwrap()
    }

    fn text(e: &IclEpisode) -> String {
        e.tokens.iter().map(|&b| b as u8 as char).collect()
    }

    #[test]
    fn an_episode_is_inputs_and_labels_then_the_query_and_is_fixed_by_its_seed() {
        let t = task();
        let a = Item {
            class: 0,
            input: b"a".to_vec(),
        };
        let k = Item {
            class: 3,
            input: b"k".to_vec(),
        };
        let q = Item {
            class: 0,
            input: b"b".to_vec(),
        };
        // class 0 is labelled '7' and class 3 '1' in this episode
        let e = t.render(b"750123", &[&a, &k], &q);
        assert_eq!(text(&e), "a7k1b7");
        assert_eq!((e.len(), t.prompt_len(2), e.shots()), (5, 5, 2));
        assert_eq!(e.label_pos, vec![1, 3, 5]);
        assert_eq!(e.answer(), b'7');

        let make = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..3)
                .map(|_| t.episode(&mut rng, 31, Relabel::Random))
                .collect::<Vec<_>>()
        };
        assert_eq!(make(4), make(4));
        assert_ne!(make(4), make(5));
        for e in make(4) {
            // 31 shots fill the full plan's context of 64 exactly
            assert_eq!(e.len(), 63);
            assert_eq!(t.max_shots(64), 31);
            for (i, &b) in e.tokens.iter().enumerate() {
                let set: &[u8] = if i % 2 == 0 { ALPHABET } else { LABELS };
                assert!(set.contains(&(b as u8)), "byte {i} of {}", text(&e));
            }
            for (i, &p) in e.label_pos.iter().enumerate() {
                assert_eq!(e.tokens[p] as u8, e.labels[e.classes[i]]);
            }
        }
        // the task seed fixes the classes
        assert_eq!(IclTask::synthetic(6, 2, 1, 0.2, 1).unwrap(), t);
        assert_ne!(
            IclTask::synthetic(6, 2, 1, 0.2, 2).unwrap().letters,
            t.letters
        );
    }

    #[test]
    fn labels_are_drawn_afresh_for_every_episode() {
        let t = task();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut of_class0 = HashSet::new();
        let mut maps = HashSet::new();
        for _ in 0..200 {
            let l = t.labels(&mut rng, Relabel::Random);
            assert_eq!(l.iter().collect::<HashSet<_>>().len(), 6, "{l:?}");
            assert!(l.iter().all(|b| LABELS.contains(b)));
            of_class0.insert(l[0]);
            maps.insert(l);
        }
        assert_eq!(of_class0.len(), 10);
        assert!(maps.len() > 190, "{}", maps.len());
        // a rotation gives consecutive digits (mod 10) from a random start
        let mut starts = HashSet::new();
        for _ in 0..100 {
            let l = t.labels(&mut rng, Relabel::Rotation);
            for (c, &b) in l.iter().enumerate() {
                assert_eq!((b - b'0') as usize, ((l[0] - b'0') as usize + c) % 10);
            }
            starts.insert(l[0]);
        }
        assert_eq!(starts.len(), 10);
        // test episodes relabel at random too: the label of class 0 varies over the test set
        let tests = test_set(&t, 100, 4, 2, 1);
        let of_class0: HashSet<u8> = tests.iter().map(|e| e.labels[0]).collect();
        assert_eq!(of_class0.len(), 10);
    }

    #[test]
    fn every_label_and_nothing_else_is_a_target() {
        let t = task();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let e = t.episode(&mut rng, 31, Relabel::Random);
        let y = e.label_targets();
        assert_eq!(y.len(), e.len());
        assert_eq!(counted(&y), 32);
        for (i, &target) in y.iter().enumerate() {
            if e.label_pos.contains(&(i + 1)) {
                assert_eq!(target, e.tokens[i + 1]);
                assert!(LABELS.contains(&(target as u8)));
            } else {
                assert_eq!(target, IGNORE, "position {i} of {}", text(&e));
            }
        }
        // the query's label is the last target, read after the query's input
        assert_eq!(*y.last().unwrap(), e.answer() as u32);
    }

    #[test]
    fn classes_overlap_through_the_noise_at_the_rate_worked_out_by_hand() {
        let t = task();
        // the full plan's six sets of two letters are disjoint, and each letter reads as its class
        let all: HashSet<u8> = t.letters.iter().flatten().copied().collect();
        assert_eq!(all.len(), 12, "{:?}", t.letters);
        for (c, set) in t.letters.iter().enumerate() {
            for &b in set {
                assert_eq!(t.classify(&[b]), c);
            }
        }
        let clean = IclTask {
            noise: 0.0,
            ..t.clone()
        };
        assert_eq!(clean.bayes_accuracy(2000, 1), 1.0);
        // right: a letter of its own set (0.8 + 0.2 · 2/16), or a letter of no set (0.2 · 4/16)
        // that `classify` gives to class 0 (a tie) when the class is 0 (1/6)
        let want = 0.8 + 0.2 * 2.0 / 16.0 + 0.2 * 4.0 / 16.0 / 6.0;
        let got = t.bayes_accuracy(40_000, 3);
        assert!((got - want).abs() < 0.008, "{got} vs {want}");
    }

    #[test]
    fn the_test_set_is_fixed_by_its_seed_and_orders_permute_the_demonstrations() {
        let t = task();
        let a = test_set(&t, 5, 31, 8, 11);
        assert_eq!(a, test_set(&t, 5, 31, 8, 11));
        assert_ne!(a, test_set(&t, 5, 31, 8, 12));
        for e in &a {
            for o in &e.orders {
                let mut s = o.clone();
                s.sort_unstable();
                assert_eq!(s, (0..31).collect::<Vec<_>>());
            }
            assert_ne!(e.orders[0], e.orders[1]);
            let p = e.prompt(&t, 4);
            assert_eq!(p.len(), t.prompt_len(4));
            let first4: Vec<usize> = e.demos[..4].iter().map(|d| d.class).collect();
            assert_eq!(p.classes[..4], first4[..]);
            let q = e.permuted(&t, 3);
            assert_eq!(q.answer(), p.answer());
            assert_eq!(q.tokens[q.len() - 1], p.tokens[p.len() - 1]);
            let want: Vec<usize> = e.orders[3].iter().map(|&i| e.demos[i].class).collect();
            assert_eq!(q.classes[..31], want[..]);
        }
    }
}
