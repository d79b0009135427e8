//! Unit tests of the configuration: option parsing, durations, the
//! default work dir, where a state dir may lie.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::dirs::resolve_state;
use super::*;

#[test]
fn a_state_dir_inside_the_upper_is_refused_in_one_readable_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let upper = dir.path().join("upper");
    let inside = upper.join("state");
    let e = resolve_state(
        Some(&inside),
        &upper,
        &[],
        &dir.path().join("w"),
        &dir.path().join("m"),
    )
    .unwrap_err();
    let ConfigError::Invalid(m) = e else {
        panic!("not a refusal of the system state: {e:?}")
    };
    assert!(
        m.contains("is inside the upper") && m.contains("--state DIR"),
        "{m}"
    );
    assert!(!m.contains("  "), "runs of blanks in {m:?}");
    assert!(!inside.exists(), "nothing created for a refused state dir");
}

#[test]
fn durations() {
    assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
    assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
    assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
    assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
    assert!(parse_duration("fast").is_err());
    assert!(parse_duration("1h").is_err());
    assert!(parse_duration("-1s").is_err());
}

fn opts(o: &str) -> Result<MountArgs, ConfigError> {
    let mut a = MountArgs {
        options: vec![o.to_string()],
        ..MountArgs::default()
    };
    apply_mount_options(&mut a).map(|_| a)
}

#[test]
fn overlay_style_options() {
    let a = opts("lowerdir=/a:/b\\:c,upperdir=/u,workdir=/w,rw,ro,allow_other,nodev").unwrap();
    assert_eq!(a.lowers, vec![PathBuf::from("/a"), PathBuf::from("/b:c")]);
    assert_eq!(a.upper, Some(PathBuf::from("/u")));
    assert_eq!(a.work, Some(PathBuf::from("/w")));
    assert!(a.read_only && a.allow_other);
}

#[test]
fn option_values_keep_their_blanks() {
    // Found by fuzz_rendered_mount_options_round_trip: the whole option
    // was trimmed, so `upperdir=/data/x ` mounted `/data/x`.
    let a = opts("upperdir=/u ,workdir= /w\\,,lowerdir=/a :/b, ro ").unwrap();
    assert_eq!(a.upper, Some(PathBuf::from("/u ")));
    assert_eq!(a.work, Some(PathBuf::from(" /w,")));
    assert_eq!(a.lowers, vec![PathBuf::from("/a "), PathBuf::from("/b")]);
    assert!(a.read_only);
}

#[test]
fn bad_options() {
    assert!(matches!(opts("frobnicate"), Err(ConfigError::Usage(m)) if m.contains("frobnicate")));
    assert!(matches!(opts("lowerdir="), Err(ConfigError::Usage(_))));
    assert!(matches!(
        opts("lowerdir=/a::/b"),
        Err(ConfigError::Usage(_))
    ));
    let mut a = MountArgs {
        upper: Some("/u".into()),
        options: vec!["upperdir=/v".into()],
        ..MountArgs::default()
    };
    assert!(apply_mount_options(&mut a).is_err());
}

#[test]
fn layerfs_options_set_the_long_option_fields() {
    let a = opts(
        "rw,lowerdir=/l,upperdir=/u,state=/s,policy=/p,log_file=/log,scratch=a/**,\
         scratch=b\\,c/**,threads=3,lower_timeout=250ms,journal_max_size=1M,noexec,\
         _netdev,nofail,user,owner,X-mount.mkdir,x-systemd.requires=nfs.mount",
    )
    .unwrap();
    assert_eq!(a.state, Some(PathBuf::from("/s")));
    assert_eq!(a.policy_file, Some(PathBuf::from("/p")));
    assert_eq!(a.log_file, Some(PathBuf::from("/log")));
    assert_eq!(a.scratch, vec!["a/**".to_string(), "b,c/**".to_string()]);
    assert_eq!(a.threads, Some(3));
    assert_eq!(a.lower_timeout, Some(Duration::from_millis(250)));
    assert!(a.no_exec);
    // journal_max_size only adjusts a journal that is on.
    assert!(a.journal.is_none());
    let mut j = MountArgs {
        journal: Some(Default::default()),
        options: vec!["journal_max_size=1M,journal_max_age=2h".into()],
        ..MountArgs::default()
    };
    apply_mount_options(&mut j).unwrap();
    let jo = j.journal.as_ref().unwrap();
    assert_eq!(
        (jo.max_bytes, jo.max_age),
        (1 << 20, Duration::from_secs(7200))
    );
    j.options = vec!["no_journal".into()];
    apply_mount_options(&mut j).unwrap();
    assert!(j.journal.is_none());
    assert!(!opts("noexec,exec").unwrap().no_exec);
}

#[test]
fn bad_layerfs_options_name_the_option() {
    for (o, needle) in [
        ("threads=many", "`many` is not a number"),
        ("lower_timeout=soon", "invalid duration"),
        ("journal_max_size=big", "invalid size"),
        ("noexec=1", "takes no value"),
        ("policy=", "-o policy= needs a value"),
        ("frob=1", "unknown mount option `frob=1`"),
    ] {
        match opts(o) {
            Err(ConfigError::Usage(m)) => assert!(m.contains(needle), "{o}: {m}"),
            other => panic!("{o} accepted: {other:?}"),
        }
    }
    let mut a = MountArgs {
        policy_file: Some("/p".into()),
        options: vec!["policy=/q".into()],
        ..MountArgs::default()
    };
    assert!(
        matches!(apply_mount_options(&mut a), Err(ConfigError::Usage(m)) if m.contains("given twice"))
    );
}

#[test]
fn sloppy_split_keeps_known_options_whole() {
    let (kept, dropped) =
        split_known_options(&["lowerdir=/a\\,b,frob,upperdir=/u,x-y=1,zap=2".into()]);
    assert_eq!(dropped, vec!["frob".to_string(), "zap=2".to_string()]);
    let a = opts(&kept.join(",")).unwrap();
    assert_eq!(a.lowers, vec![PathBuf::from("/a,b")]);
    assert_eq!(a.upper, Some(PathBuf::from("/u")));
}

#[test]
fn work_default_is_hidden_sibling() {
    assert_eq!(
        default_work_dir(Path::new("/var/lib/x/upper")).unwrap(),
        PathBuf::from("/var/lib/x/.upper.layerfs-work")
    );
}
