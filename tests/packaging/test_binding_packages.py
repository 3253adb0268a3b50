"""The bindings as a stranger installs them (issue 28.1): each artifact is built from a clean checkout of its
directory (the files git tracks, nothing built), installed into a fresh project the way its ecosystem does
it, and that project runs a round trip against a real ``pymq-server``.

* Java: ``mvn install`` into an empty local repository yields the jar, its sources and javadoc and a POM with
  the metadata a repository such as Maven Central asks for; a fresh Maven project that only names
  ``io.pymq:pymq-jms`` resolves it (with its dependencies, from the POM) from that repository, and sends and
  receives.  The empty repository reads everything else through a mirror on the developer's own Maven
  repository (``~/.m2/repository``, filled by .ci/interop-clients.sh), so nothing is downloaded.
* TypeScript: ``npm pack`` from the clean checkout (its ``prepack`` installs the build tools from the lock
  file and builds), the tarball installed into a fresh Node project, which connects and round-trips.
* Go: the module served as ``proxy.golang.org`` serves a ``bindings/go/vX.Y.Z`` tag (a file:// module proxy
  made here), required by a fresh module with ``go get``, built, and run.

The toolchains come from ``PYMQ_MVN``, ``PYMQ_NPM`` and ``PYMQ_GO`` (``eval "$(.ci/interop-clients.sh)"``);
without one its test skips, or fails when ``CI`` is set (the rule of tests/storage/services.py).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import uuid
import xml.etree.ElementTree as ET
import zipfile

import pytest

from tests.interop.foreign import PROVIDER
from tests.storage.disks import BrokerProcess
from tests.storage.services import service_url

ROOT = pathlib.Path(__file__).parents[2]
GO_MODULE = "github.com/pymq/pymq/bindings/go"


def run(argv: list[str], cwd: pathlib.Path, timeout: int = 600, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    return done


def clean_checkout(binding: str, dest: pathlib.Path) -> pathlib.Path:
    """The tracked files of bindings/<binding> as they are in the work tree (no build output, no
    node_modules): what a fresh clone holds."""
    files = subprocess.run(["git", "ls-files", "-z", f"bindings/{binding}"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            target = dest / pathlib.Path(name).relative_to(f"bindings/{binding}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


@pytest.fixture
def broker(tmp_path):
    b = BrokerProcess(tmp_path / "broker-data")
    yield b
    b.proc.kill()
    b.proc.wait(10)


def queue_name() -> str:
    return "pkg-" + uuid.uuid4().hex[:12]


# -- Java ------------------------------------------------------------------------------------------------
JAVA_APP = """
import io.pymq.jms.PymqConnectionFactory;
import jakarta.jms.*;

public class App {
    public static void main(String[] args) throws Exception {
        ConnectionFactory cf = new PymqConnectionFactory(args[0]);
        try (Connection c = cf.createConnection()) {
            c.start();
            Session s = c.createSession();
            Queue q = s.createQueue(args[1]);
            TextMessage m = s.createTextMessage("hello from a fresh Maven project");
            m.setIntProperty("n", 7);
            s.createProducer(q).send(m);
            TextMessage got = (TextMessage) s.createConsumer(q).receive(10000);
            System.out.println(got.getText() + " n=" + got.getObjectProperty("n").getClass().getSimpleName() + ":"
                    + got.getIntProperty("n"));
        }
    }
}
"""

JAVA_APP_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>example</groupId>
  <artifactId>app</artifactId>
  <version>1</version>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencies>
    <dependency>
      <groupId>io.pymq</groupId>
      <artifactId>pymq-jms</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-compiler-plugin</artifactId><version>3.13.0</version></plugin>
      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-resources-plugin</artifactId><version>3.3.1</version></plugin>
      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId><version>3.8.1</version></plugin>
    </plugins>
  </build>
</project>
"""

MAVEN_MIRROR = """<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors>
    <mirror><id>this-machine</id><mirrorOf>*</mirrorOf><url>{url}</url></mirror>
  </mirrors>
</settings>
"""

POM = "{http://maven.apache.org/POM/4.0.0}"


def test_maven_install_gives_a_complete_artifact_set_a_fresh_project_runs(tmp_path, broker):
    mvn = service_url("PYMQ_MVN", "Maven for bindings/java", PROVIDER)
    cache = pathlib.Path.home() / ".m2" / "repository"
    if not cache.is_dir():
        pytest.fail(f"{cache} is missing: run .ci/interop-clients.sh first (it fills it from Maven Central)")
    settings = tmp_path / "settings.xml"
    settings.write_text(MAVEN_MIRROR.format(url=cache.as_uri()))
    repo = tmp_path / "repo"            # the clean local repository
    src = clean_checkout("java", tmp_path / "src")
    maven = [mvn, "-B", "-q", "-s", str(settings), f"-Dmaven.repo.local={repo}"]
    run([*maven, "install", "-DskipTests"], src)

    pom = ET.parse(src / "pom.xml").getroot()
    version = pom.findtext(f"{POM}version")
    installed = repo / "io" / "pymq" / "pymq-jms" / version
    for suffix in ("", "-sources", "-javadoc"):
        jar = installed / f"pymq-jms-{version}{suffix}.jar"
        assert jar.is_file(), f"mvn install made no {jar.name}: {sorted(p.name for p in installed.iterdir())}"
        with zipfile.ZipFile(jar) as z:
            names = z.namelist()
        wanted = {"": "io/pymq/jms/PymqConnectionFactory.class", "-sources": "io/pymq/jms/PymqConnectionFactory.java",
                  "-javadoc": "io/pymq/jms/PymqConnectionFactory.html"}[suffix]
        assert wanted in names, f"{jar.name} lacks {wanted}"
    meta = ET.parse(installed / f"pymq-jms-{version}.pom").getroot()
    assert meta.findtext(f"{POM}name") and meta.findtext(f"{POM}description")
    assert meta.findtext(f"{POM}licenses/{POM}license/{POM}name") == "Apache-2.0"
    assert meta.findtext(f"{POM}developers/{POM}developer/{POM}name")
    assert meta.find(f"{POM}scm") is not None
    text = (installed / f"pymq-jms-{version}.pom").read_text()
    assert ".example" not in text and "localhost" not in text, "no placeholder addresses in the published POM"

    app = tmp_path / "app"
    (app / "src" / "main" / "java").mkdir(parents=True)
    (app / "pom.xml").write_text(JAVA_APP_POM.format(version=version))
    (app / "src" / "main" / "java" / "App.java").write_text(JAVA_APP)
    run([*maven, "compile", "dependency:build-classpath", "-Dmdep.outputFile=cp.txt"], app)
    classpath = (app / "cp.txt").read_text().strip()
    assert str(repo) in classpath and "pymq-jms" in classpath and "jakarta.jms-api" in classpath, classpath
    out = run(["java", "-cp", f"{app / 'target' / 'classes'}{os.pathsep}{classpath}", "App",
               f"stomp://127.0.0.1:{broker.port}", queue_name()], app, timeout=120)
    assert out.stdout.strip() == "hello from a fresh Maven project n=Integer:7", out.stdout + out.stderr


# -- TypeScript ------------------------------------------------------------------------------------------
TS_APP = """
import { connect, Message } from '@pymq/client/node';

const [port, dest] = process.argv.slice(2);
const conn = await connect({ host: '127.0.0.1', port: Number(port) });
const sub = await conn.subscribe(dest);
await conn.send(dest, Message.text('hello from a fresh Node project').setProperty('n', 7));
const got = await sub.receive(10000);
console.log(`${got.text} n=${got.propertyType('n')}:${got.properties.n}`);
await conn.close();
"""


def test_npm_pack_from_a_clean_checkout_installs_and_runs(tmp_path, broker):
    npm = service_url("PYMQ_NPM", "npm for bindings/typescript", PROVIDER)
    src = clean_checkout("typescript", tmp_path / "src")
    assert not (src / "node_modules").exists() and not (src / "dist").exists()
    out = run([npm, "pack", "--json", "--pack-destination", str(tmp_path)], src)
    info = json.loads(out.stdout[out.stdout.index("["):])[0]
    tarball = tmp_path / info["filename"]
    assert tarball.is_file()
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "app", "version": "1.0.0", "private": True,
                                                  "type": "module"}))
    run([npm, "install", "--no-audit", "--no-fund", "--offline", str(tarball)], app)
    (app / "main.js").write_text(TS_APP)
    got = run(["node", "main.js", str(broker.port), f"/queue/{queue_name()}"], app, timeout=120)
    assert got.stdout.strip() == "hello from a fresh Node project n=int:7", got.stdout + got.stderr


# -- Go --------------------------------------------------------------------------------------------------
GO_APP = """package main

import (
	"context"
	"fmt"
	"os"
	"time"

	pymq "github.com/pymq/pymq/bindings/go"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := pymq.DialContext(ctx, os.Args[1], pymq.Options{})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, os.Args[2], pymq.SubscribeOptions{})
	if err != nil {
		panic(err)
	}
	m := pymq.NewTextMessage("hello from a fresh Go module")
	_ = m.SetProperty("n", 7)
	if err := c.Send(ctx, os.Args[2], m); err != nil {
		panic(err)
	}
	got, err := sub.Receive(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s n=%T:%v\\n", got.Text(), got.Properties["n"], got.Properties["n"])
}
"""


def test_go_module_resolves_by_its_path_and_runs(tmp_path, broker):
    go = service_url("PYMQ_GO", "go for bindings/go", PROVIDER)
    src = clean_checkout("go", tmp_path / "src")
    gomod = (src / "go.mod").read_text()
    assert re.search(rf"^module {re.escape(GO_MODULE)}$", gomod, re.M), gomod
    version = "v0.1.0"                      # the tag bindings/go/v0.1.0 (docs/releasing.md)
    proxy = tmp_path / "proxy"
    at = proxy / GO_MODULE / "@v"
    at.mkdir(parents=True)
    (at / "list").write_text(version + "\n")
    (at / f"{version}.info").write_text(json.dumps({"Version": version, "Time": "2026-01-01T00:00:00Z"}))
    (at / f"{version}.mod").write_text(gomod)
    with zipfile.ZipFile(at / f"{version}.zip", "w") as z:
        for f in sorted(src.rglob("*")):
            if f.is_file():
                z.write(f, f"{GO_MODULE}@{version}/{f.relative_to(src).as_posix()}")
    app = tmp_path / "app"
    app.mkdir()
    (app / "go.mod").write_text("module example.com/app\n\ngo 1.19\n")
    (app / "main.go").write_text(GO_APP)
    env = dict(os.environ, GOPROXY=proxy.as_uri(), GOSUMDB="off", GOFLAGS="-mod=mod", GOPRIVATE="",
               GONOSUMDB="", GOWORK="off", GOPATH=str(tmp_path / "gopath"), GOMODCACHE=str(tmp_path / "modcache"))
    run([go, "get", f"{GO_MODULE}@{version}"], app, env=env)
    run([go, "build", "-o", "app", "."], app, env=env)
    got = run([str(app / "app"), f"127.0.0.1:{broker.port}", f"/queue/{queue_name()}"], app, timeout=120, env=env)
    assert got.stdout.strip() == "hello from a fresh Go module n=int64:7", got.stdout + got.stderr
