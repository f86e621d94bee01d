//! Signals as data: the names records and journals spell ("TERM", "SIGTERM", a number), and
//! the numbers the kernel takes. Sending a signal is [`crate::stop`]'s business, through
//! [`crate::sys`]; this module only names them.

/// The signals agent-run sends or names in records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sig {
    Hup,
    Int,
    Quit,
    Kill,
    Term,
    Cont,
    Stop,
    Tstp,
    Chld,
    Winch,
    Pipe,
    Usr1,
    Other(i32),
}

impl Sig {
    /// The signal number.
    pub fn number(self) -> i32 {
        match self {
            Sig::Hup => libc::SIGHUP,
            Sig::Int => libc::SIGINT,
            Sig::Quit => libc::SIGQUIT,
            Sig::Kill => libc::SIGKILL,
            Sig::Term => libc::SIGTERM,
            Sig::Cont => libc::SIGCONT,
            Sig::Stop => libc::SIGSTOP,
            Sig::Tstp => libc::SIGTSTP,
            Sig::Chld => libc::SIGCHLD,
            Sig::Winch => libc::SIGWINCH,
            Sig::Pipe => libc::SIGPIPE,
            Sig::Usr1 => libc::SIGUSR1,
            Sig::Other(n) => n,
        }
    }

    /// From a number.
    pub fn from_number(n: i32) -> Sig {
        match n {
            libc::SIGHUP => Sig::Hup,
            libc::SIGINT => Sig::Int,
            libc::SIGQUIT => Sig::Quit,
            libc::SIGKILL => Sig::Kill,
            libc::SIGTERM => Sig::Term,
            libc::SIGCONT => Sig::Cont,
            libc::SIGSTOP => Sig::Stop,
            libc::SIGTSTP => Sig::Tstp,
            libc::SIGCHLD => Sig::Chld,
            libc::SIGWINCH => Sig::Winch,
            libc::SIGPIPE => Sig::Pipe,
            libc::SIGUSR1 => Sig::Usr1,
            n => Sig::Other(n),
        }
    }

    /// The name without the SIG prefix, as records spell it ("TERM").
    pub fn name(self) -> String {
        match self {
            Sig::Hup => "HUP".into(),
            Sig::Int => "INT".into(),
            Sig::Quit => "QUIT".into(),
            Sig::Kill => "KILL".into(),
            Sig::Term => "TERM".into(),
            Sig::Cont => "CONT".into(),
            Sig::Stop => "STOP".into(),
            Sig::Tstp => "TSTP".into(),
            Sig::Chld => "CHLD".into(),
            Sig::Winch => "WINCH".into(),
            Sig::Pipe => "PIPE".into(),
            Sig::Usr1 => "USR1".into(),
            Sig::Other(n) => SIG_NAMES
                .iter()
                .find(|(num, _)| *num == n)
                .map_or_else(|| n.to_string(), |(_, name)| (*name).to_string()),
        }
    }

    /// From a record's name ("TERM", "SIGTERM" or a number).
    pub fn from_name(s: &str) -> Option<Sig> {
        let s = s.strip_prefix("SIG").unwrap_or(s);
        if let Ok(n) = s.parse::<i32>() {
            return (1..=64).contains(&n).then(|| Sig::from_number(n));
        }
        SIG_NAMES
            .iter()
            .find(|(_, name)| *name == s)
            .map(|(n, _)| Sig::from_number(*n))
    }
}

const SIG_NAMES: &[(i32, &str)] = &[
    (libc::SIGHUP, "HUP"),
    (libc::SIGINT, "INT"),
    (libc::SIGQUIT, "QUIT"),
    (libc::SIGILL, "ILL"),
    (libc::SIGTRAP, "TRAP"),
    (libc::SIGABRT, "ABRT"),
    (libc::SIGBUS, "BUS"),
    (libc::SIGFPE, "FPE"),
    (libc::SIGKILL, "KILL"),
    (libc::SIGUSR1, "USR1"),
    (libc::SIGSEGV, "SEGV"),
    (libc::SIGUSR2, "USR2"),
    (libc::SIGPIPE, "PIPE"),
    (libc::SIGALRM, "ALRM"),
    (libc::SIGTERM, "TERM"),
    (libc::SIGCHLD, "CHLD"),
    (libc::SIGCONT, "CONT"),
    (libc::SIGSTOP, "STOP"),
    (libc::SIGTSTP, "TSTP"),
    (libc::SIGTTIN, "TTIN"),
    (libc::SIGTTOU, "TTOU"),
    (libc::SIGURG, "URG"),
    (libc::SIGXCPU, "XCPU"),
    (libc::SIGXFSZ, "XFSZ"),
    (libc::SIGVTALRM, "VTALRM"),
    (libc::SIGPROF, "PROF"),
    (libc::SIGWINCH, "WINCH"),
    (libc::SIGIO, "IO"),
    (libc::SIGPWR, "PWR"),
    (libc::SIGSYS, "SYS"),
];
