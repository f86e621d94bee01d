//! User names for records, without NSS.

/// The login name of `uid`: `$USER` when /etc/passwd agrees, else the first /etc/passwd entry
/// with that uid, else the number. Read directly rather than through NSS: a static binary has no
/// NSS modules, and a launch should not pay for loading them.
pub fn user_name(uid: u32) -> String {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let entries: Vec<(&str, Option<u32>)> = passwd
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let id = f.nth(1)?.parse().ok();
            Some((name, id))
        })
        .collect();
    let env_user = std::env::var("USER").ok();
    if let Some(u) = env_user.as_deref() {
        if entries.iter().any(|(n, id)| *n == u && *id == Some(uid)) {
            return u.to_string();
        }
    }
    entries
        .iter()
        .find(|(_, id)| *id == Some(uid))
        .map_or_else(|| uid.to_string(), |(n, _)| n.to_string())
}
