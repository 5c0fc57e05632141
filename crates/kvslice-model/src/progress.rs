//! Progress through long forward passes: an observer on the calling thread hears each layer
//! a multi-token forward finishes (a prompt or a prompt chunk; decode steps stay silent).
//!
//! The forward runs on the thread that calls it, so a thread-local observer sees exactly its
//! own work, and code that does not observe pays one thread-local read per layer.

use std::cell::RefCell;

/// One finished layer of a forward pass over `tokens` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerDone {
    /// 0-based.
    pub layer: usize,
    pub layers: usize,
    pub tokens: usize,
}

type Observer = Box<dyn FnMut(LayerDone)>;

thread_local! {
    static OBSERVER: RefCell<Option<Observer>> = const { RefCell::new(None) };
}

/// Calls `observer` for every layer finished on this thread until the guard drops (which
/// restores the observer before it).
pub fn observe(observer: impl FnMut(LayerDone) + 'static) -> Guard {
    let previous = OBSERVER.with(|o| o.borrow_mut().replace(Box::new(observer)));
    Guard { previous: Some(previous) }
}

/// Ends an [`observe`] when dropped.
pub struct Guard {
    previous: Option<Option<Observer>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            OBSERVER.with(|o| *o.borrow_mut() = previous);
        }
    }
}

/// Reports a finished layer to this thread's observer, if any (the model calls it).
pub(crate) fn layer_done(step: LayerDone) {
    OBSERVER.with(|o| {
        // an observer that forwards again on this thread is not re-entered
        if let Ok(mut o) = o.try_borrow_mut()
            && let Some(f) = o.as_mut()
        {
            f(step);
        }
    });
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    #[test]
    fn observers_nest_and_end_with_their_guard() {
        let seen = Rc::new(RefCell::new(Vec::new()));
        let step = |layer| LayerDone { layer, layers: 2, tokens: 7 };
        layer_done(step(0)); // nobody listens
        {
            let outer = seen.clone();
            let _g = observe(move |s| outer.borrow_mut().push(("outer", s.layer)));
            layer_done(step(0));
            {
                let inner = seen.clone();
                let _g = observe(move |s| inner.borrow_mut().push(("inner", s.layer)));
                layer_done(step(1));
            }
            layer_done(step(1));
        }
        layer_done(step(0));
        assert_eq!(*seen.borrow(), vec![("outer", 0), ("inner", 1), ("outer", 1)]);
    }
}
