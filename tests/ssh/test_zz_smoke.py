def test_smoke(fab):
    r = fab("train", "--arg", "vars.num_batches=4")
    print(r.stdout[-5000:]); print(r.stderr[-3000:])
    assert r.returncode == 0
