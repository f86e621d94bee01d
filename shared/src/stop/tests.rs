use super::*;

/// The levels a stop reaches and when, for a run whose processes never go: the schedule of
/// [`deadline_of`] and [`level_after`] driven as the loop drives it, time jumping to each
/// deadline.
fn schedule(t: Timings) -> Vec<(Level, Duration)> {
    let hup_at = (!t.hup_after.is_zero()).then_some(t.hup_after);
    let mut kill_at = t.grace;
    let mut confirm_until = None;
    let mut level = Level::Term;
    let mut now = Duration::ZERO;
    let mut out = vec![(Level::Term, now)];
    loop {
        let deadline = deadline_of(level, hup_at, kill_at, || {
            *confirm_until.get_or_insert(now + t.confirm)
        });
        now = now.max(deadline);
        level = match level_after(level, deadline, &mut kill_at, now) {
            Some(next) => next,
            None => break,
        };
        out.push((level, now));
    }
    out.push((level, now)); // the end of the confirm window
    out
}

#[test]
fn term_hup_kill_on_their_deadlines() {
    let ms = Duration::from_millis;
    let timings = |hup, grace, confirm| Timings {
        hup_after: ms(hup),
        grace: ms(grace),
        confirm: ms(confirm),
    };
    use Level::*;
    let cases = [
        // The defaults: TERM, HUP at 500 ms, KILL at 5 s, 2 s to confirm.
        (
            Timings::default(),
            vec![(Term, 0), (Hup, 500), (Kill, 5000), (Kill, 7000)],
        ),
        (
            timings(100, 1000, 50),
            vec![(Term, 0), (Hup, 100), (Kill, 1000), (Kill, 1050)],
        ),
        // hup_after zero: no HUP step at all.
        (
            timings(0, 1000, 50),
            vec![(Term, 0), (Kill, 1000), (Kill, 1050)],
        ),
        // A HUP step at or after the grace never comes: KILL at the grace.
        (
            timings(1000, 1000, 50),
            vec![(Term, 0), (Kill, 1000), (Kill, 1050)],
        ),
        (
            timings(2000, 1000, 50),
            vec![(Term, 0), (Kill, 1000), (Kill, 1050)],
        ),
        // A HUP step just before the grace still comes.
        (
            timings(999, 1000, 50),
            vec![(Term, 0), (Hup, 999), (Kill, 1000), (Kill, 1050)],
        ),
        // No confirm window: the stop ends as KILL goes out.
        (
            timings(100, 1000, 0),
            vec![(Term, 0), (Hup, 100), (Kill, 1000), (Kill, 1000)],
        ),
        // Zero grace: KILL at once.
        (timings(500, 0, 50), vec![(Term, 0), (Kill, 0), (Kill, 50)]),
        (timings(0, 0, 0), vec![(Term, 0), (Kill, 0), (Kill, 0)]),
    ];
    for (t, want) in cases {
        let want: Vec<(Level, Duration)> = want.into_iter().map(|(l, at)| (l, ms(at))).collect();
        assert_eq!(schedule(t), want, "{t:?}");
    }
}

/// (level, its deadline, kill_at, now) -> (the next level, kill_at after): KILL goes out
/// when it goes out (a late wake moves it, and so the confirm window, to `now`).
#[test]
fn each_level_leads_to_the_next_and_kill_moves_to_when_it_is_sent() {
    use Level::*;
    let cases = [
        // TERM whose deadline was the HUP step: HUP, the KILL stays where it was.
        (Term, 100, 1000, 100, Some(Hup), 1000),
        (Term, 100, 1000, 400, Some(Hup), 1000),
        // TERM whose deadline was the KILL: KILL, at now (late or not).
        (Term, 1000, 1000, 1000, Some(Kill), 1000),
        (Term, 1000, 1000, 1300, Some(Kill), 1300),
        (Hup, 1000, 1000, 1000, Some(Kill), 1000),
        (Hup, 1000, 1000, 1200, Some(Kill), 1200),
        // After KILL the stop is over, and nothing moves.
        (Kill, 1050, 1000, 1050, None, 1000),
    ];
    for (level, deadline, kill_at, now, want, want_kill_at) in cases {
        let mut at = kill_at;
        assert_eq!(
            level_after(level, deadline, &mut at, now),
            want,
            "{level:?} deadline {deadline} kill_at {kill_at} now {now}"
        );
        assert_eq!(at, want_kill_at, "{level:?} deadline {deadline} now {now}");
    }
}

#[test]
fn the_confirm_window_is_asked_for_only_at_kill() {
    let asked = std::cell::Cell::new(0);
    let ask = || {
        asked.set(asked.get() + 1);
        7
    };
    assert_eq!(deadline_of(Level::Term, Some(1), 5, ask), 1);
    assert_eq!(deadline_of(Level::Hup, None, 5, ask), 5);
    assert_eq!(asked.get(), 0);
    assert_eq!(deadline_of(Level::Kill, None, 5, ask), 7);
    assert_eq!(asked.get(), 1);
}
