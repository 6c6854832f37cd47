"""What a shell prints, in the user's language, when a signal ends a job's process: bash's
job-control message is the C library's strsignal() of the signal, translated by the locale
(LANG=zh_CN.UTF-8 prints '已杀死' where LANG=C prints 'Killed', '段错误 (核心已转储)' for
'Segmentation fault (core dumped)'). Many training logs in public reports come from such
machines. The words are glibc's own translations (libc.mo of glibc 2.36, read with gettext on
this machine: Killed, Segmentation fault, Aborted, Bus error, Illegal instruction, Floating
point exception); English is in the rules themselves."""

from __future__ import annotations

import re

from ddpdoctor.rules.base import Signature

KILLED = (
    "已杀死",  # zh_CN
    "強制結束",  # zh_TW
    "強制終了",  # ja
    "죽었음",  # ko
    "Getötet",  # de
    "Processus arrêté",  # fr
    "Terminado (killed)",  # es
    "Убито",  # ru
    "Вбито",  # uk
    "Morto",  # pt_BR
    "Ucciso",  # it
    "Unicestwiony",  # pl
    "Süreç durduruldu",  # tr
    "Bị buộc kết thúc",  # vi
)
"""SIGKILL's name."""

CRASHED = (
    # SIGSEGV
    "段错误",  # zh_CN
    "程式記憶體區段錯誤",  # zh_TW
    "세그멘테이션 오류",  # ko
    "Speicherzugriffsfehler",  # de
    "Erreur de segmentation",  # fr
    "Violación de segmento",  # es
    "Ошибка сегментирования",  # ru
    "Помилка адресування",  # uk
    "Falha de segmentação",  # pt_BR
    "Errore di segmentazione",  # it
    "Naruszenie ochrony pamięci",  # pl
    "Parçalama arızası",  # tr
    "Lỗi phân đoạn",  # vi
    # SIGABRT (ja and zh_TW's '中止', 'Abandon' and the like are words of prose: not read)
    "已放弃",  # zh_CN
    "중지됨",  # ko
    "Abgebrochen",  # de
    "Аварийный останов",  # ru
    # SIGBUS
    "总线错误",  # zh_CN
    "匯流排錯誤",  # zh_TW
    "バスエラー",  # ja
    "버스 오류",  # ko
    "Bus-Zugriffsfehler",  # de
    "Erreur du bus",  # fr
    "Error del bus",  # es
    "Ошибка шины",  # ru
    # SIGILL, SIGFPE
    "非法指令",  # zh_CN
    "Ungültiger Maschinenbefehl",  # de
    "浮点数例外",  # zh_CN
    "浮動小数点例外",  # ja
)
"""The names of the signals a native crash ends a process with."""

CORE_DUMPED = r"(?:\s*[(（][^()（）\n]{1,40}[)）])?"
"""bash's '(core dumped)' after the name, translated too: '（核心已转储）', '(코어 덤프됨)'."""


def shell_signatures(names: tuple[str, ...], suggests: bool) -> tuple[Signature, ...]:
    """Each name as bash prints it: the whole line ('已杀死', '段错误 (核心已转储)'), after the
    job's pid in a script's message ('run.sh: 行 3: 48213 已杀死    python train.py'), or, for a
    name in CJK script, at the end of a line a progress bar left without its newline
    ('ETA: 2652s已杀死')."""
    out: list[Signature] = []
    for name in names:
        word = re.escape(name)
        cjk = not name.isascii() and all(ord(c) > 0x2E80 for c in name if not c.isspace())
        glued = rf"|{word}{CORE_DUMPED}\s*$" if cjk else ""
        out.append(
            Signature(
                rf"^\s*{word}{CORE_DUMPED}\s*$|\b\d{{2,9}} +{word}{CORE_DUMPED} +\S{glued}",
                name,
                suggests=suggests,
            )
        )
    return tuple(out)
