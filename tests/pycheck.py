"""pycheck.py: the checks the Python package's tests share. check(ok, what)
records and prints "FAIL: what" when ok is false; raises(fn, *words) expects
fn() to raise tessera.Error whose message holds every word, and returns the
message. `fails` lists the failed checks."""
import tessera

fails = []


def check(ok, what):
    if not ok:
        fails.append(what)
        print("FAIL: " + what)


def raises(fn, *words):
    """fn() raises tessera.Error whose message holds every word."""
    try:
        fn()
    except tessera.Error as e:
        msg = str(e)
        check(all(w in msg for w in words), "error %r lacks %s" % (msg, words))
        return msg
    check(False, "no error where one holding %s was due" % (words,))
    return ""
